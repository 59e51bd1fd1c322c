#![no_main]
//! Decodes arbitrary bytes as each kind of track file: never panics; the good prefix is
//! consistent (its length matches `good_bytes`, re-encoding it gives back exactly those bytes);
//! the consistency check and the key-frame detectors never panic on what comes out.
use libfuzzer_sys::fuzz_target;
use penstock_core::track::format::{HEADER_BYTES, RECORD_BYTES};
use penstock_core::track::{
    FrameDetector, FrameRecord, FrameRule, PacketRecord, Record, TimeRecord, check, decode,
    encode_record,
};

fn prefix<R: Record>(data: &[u8]) -> Vec<R> {
    let Ok(d) = decode::<R>(data, 1 << 16) else {
        return Vec::new();
    };
    assert_eq!(
        d.good_bytes as usize,
        HEADER_BYTES + d.records.len() * RECORD_BYTES
    );
    assert!(d.good_bytes as usize <= data.len());
    let mut again = data[..HEADER_BYTES].to_vec();
    for r in &d.records {
        again.extend_from_slice(&encode_record(r));
    }
    assert_eq!(&again[..], &data[..d.good_bytes as usize]);
    d.records
}

fuzz_target!(|data: &[u8]| {
    let time = prefix::<TimeRecord>(data);
    let packets = prefix::<PacketRecord>(data);
    let frames = prefix::<FrameRecord>(data);
    let media_len = data.len() as u64 * 1000;
    let report = check(&time, &packets, &frames, media_len);
    assert!(report.readable_packets <= time.len().min(packets.len()) as u64);
    assert!(report.readable_media_bytes <= media_len);
    for rule in [
        FrameRule::EveryPacket,
        FrameRule::MpegTs { h264_idr: true },
        FrameRule::Rtp { h264: true },
    ] {
        let mut d = FrameDetector::new(rule);
        for chunk in data.chunks(188 * 7) {
            d.observe(chunk);
        }
    }
});
