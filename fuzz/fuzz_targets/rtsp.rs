#![no_main]
//! Arbitrary bytes on an RTSP connection: the request reader (`penstock_core::rtsp::parse`,
//! rtsp-types underneath) fed the way the server feeds it — messages taken one after the
//! other from the front of the buffer, under the size limit — and each request's method
//! played through the session state machine. Never a panic; every message takes at least one
//! byte and at most what is there; a refusal has a 4xx/5xx code; the state only moves the
//! way the rules say (PLAY → Playing, PAUSE → Paused, nothing else moves it).
use libfuzzer_sys::fuzz_target;
use penstock_core::rtsp::{Method, Parsed, RtspLimits, SessionState, parse};

fuzz_target!(|data: &[u8]| {
    let limits = RtspLimits {
        request_bytes_max: 2048,
    };
    let mut at = 0;
    let mut state = SessionState::Ready;
    // At most one message per byte: the loop ends.
    for _ in 0..=data.len() {
        let rest = &data[at..];
        match parse(rest, &limits) {
            Ok(Parsed::Incomplete) => break,
            Ok(Parsed::Data { consumed, payload_at, .. }) => {
                assert!(consumed >= 4 && consumed <= rest.len() && payload_at <= consumed);
                at += consumed;
            }
            Ok(Parsed::Request(req, consumed)) => {
                assert!(consumed > 0 && consumed <= rest.len().min(limits.request_bytes_max));
                if let Some(Ok(t)) = &req.transport {
                    let _ = t;
                }
                if let Some(from) = req.range_from_ns {
                    let _ = penstock_core::rtsp::npt_text(from);
                }
                match state.check(&req.method) {
                    Ok(()) => {
                        let next = state.after(&req.method);
                        match req.method {
                            Method::Play => assert_eq!(next, SessionState::Playing),
                            Method::Pause => assert_eq!(next, SessionState::Paused),
                            _ => assert_eq!(next, state),
                        }
                        state = next;
                    }
                    Err(code) => assert_eq!(code, 455),
                }
                at += consumed;
            }
            Ok(Parsed::Refused { error, consumed, .. }) => {
                assert!((400..600).contains(&error.status()));
                assert!(consumed > 0 && consumed <= rest.len().min(limits.request_bytes_max));
                at += consumed;
            }
            Err(e) => {
                assert!((400..600).contains(&e.status()));
                break;
            }
        }
    }
    assert!(at <= data.len());
});
