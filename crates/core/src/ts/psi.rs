//! Just enough PSI (ISO/IEC 13818-1 §2.4.4) to find the PCR PID: the program association
//! table (PID 0) names each program's PMT PID; the program map table names the program's
//! `PCR_PID`.
//!
//! A section is read only when it lies whole in one TS packet and its CRC-32 checks (a PAT or
//! PMT of one program nearly always fits in 183 bytes); a longer or damaged one is ignored,
//! and the probe then falls back to the first PID that carries a PCR.

/// The PID of the program association table.
pub const PAT_PID: u16 = 0;
const PAT_TABLE_ID: u8 = 0x00;
const PMT_TABLE_ID: u8 = 0x02;

/// The first section starting in a payload that holds a PSI section start
/// (`payload_unit_start_indicator`), whole and with a good CRC: `(table_id, body)` where body
/// runs from after `last_section_number` to before the CRC.
fn section(payload: &[u8]) -> Option<(u8, &[u8])> {
    let pointer = usize::from(*payload.first()?);
    let s = payload.get(1 + pointer..)?;
    if s.len() < 3 {
        return None;
    }
    let table_id = s[0];
    // section_syntax_indicator must be 1 for PAT and PMT.
    if s[1] & 0x80 == 0 {
        return None;
    }
    let section_length = usize::from(u16::from_be_bytes([s[1] & 0x0f, s[2]]));
    // 5 header bytes after section_length, the 4-byte CRC.
    if section_length < 9 {
        return None;
    }
    let whole = s.get(..3 + section_length)?;
    if crc32_mpeg2(whole) != 0 {
        return None;
    }
    Some((table_id, &whole[8..whole.len() - 4]))
}

/// The PMT PID of the first program (`program_number` ≠ 0) in a PAT payload.
pub fn pat_first_program(payload: &[u8]) -> Option<(u16, u16)> {
    let (table_id, body) = section(payload)?;
    if table_id != PAT_TABLE_ID {
        return None;
    }
    body.chunks_exact(4).find_map(|e| {
        let program = u16::from_be_bytes([e[0], e[1]]);
        let pid = u16::from_be_bytes([e[2] & 0x1f, e[3]]);
        (program != 0).then_some((program, pid))
    })
}

/// The `PCR_PID` of a PMT payload.
pub fn pmt_pcr_pid(payload: &[u8]) -> Option<u16> {
    let (table_id, body) = section(payload)?;
    if table_id != PMT_TABLE_ID {
        return None;
    }
    let b = body.get(..2)?;
    Some(u16::from_be_bytes([b[0] & 0x1f, b[1]]))
}

/// The elementary streams of a PMT payload: `(stream_type, elementary_PID)` in the table's
/// order (the program-info and each stream's descriptors skipped).
pub fn pmt_streams(payload: &[u8]) -> Option<Vec<(u8, u16)>> {
    let (table_id, body) = section(payload)?;
    if table_id != PMT_TABLE_ID {
        return None;
    }
    let info_len = usize::from(u16::from_be_bytes([body.get(2)? & 0x0f, *body.get(3)?]));
    let mut es = body.get(4 + info_len..)?;
    let mut out = Vec::new();
    while es.len() >= 5 {
        let stream_type = es[0];
        let pid = u16::from_be_bytes([es[1] & 0x1f, es[2]]);
        let es_info_len = usize::from(u16::from_be_bytes([es[3] & 0x0f, es[4]]));
        out.push((stream_type, pid));
        es = es.get(5 + es_info_len..)?;
    }
    Some(out)
}

/// CRC-32/MPEG-2 (polynomial 0x04C11DB7, initial value all ones, no reflection, no final
/// xor). Over a whole section including its CRC field it is 0. Bitwise: it runs on a few
/// sections per file.
pub fn crc32_mpeg2(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= u32::from(b) << 24;
        for _ in 0..8 {
            crc = if crc & 0x8000_0000 != 0 {
                (crc << 1) ^ 0x04c1_1db7
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// Builds a one-packet section's payload (pointer field 0, the section, its CRC, 0xff
/// stuffing up to `payload_bytes`): for tests and the fuzz seeds.
pub fn section_payload(
    table_id: u8,
    id: u16,
    body: &[u8],
    payload_bytes: usize,
) -> Option<Vec<u8>> {
    let section_length = 5 + body.len() + 4;
    let mut s = vec![0u8];
    s.push(table_id);
    s.push(0xb0 | ((section_length >> 8) as u8 & 0x0f));
    s.push(section_length as u8);
    s.extend_from_slice(&id.to_be_bytes());
    s.extend_from_slice(&[0xc1, 0, 0]); // version 0, current; section 0 of 0
    s.extend_from_slice(body);
    let crc = crc32_mpeg2(&s[1..]);
    s.extend_from_slice(&crc.to_be_bytes());
    if s.len() > payload_bytes {
        return None;
    }
    s.resize(payload_bytes, 0xff);
    Some(s)
}
