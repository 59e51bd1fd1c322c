//! Every accepted form, every refusal, and the round-trip properties of the endpoint parser.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use proptest::prelude::*;

use super::*;

const ROLES: [Role; 2] = [Role::Source, Role::Target];

fn src(s: &str) -> Endpoint {
    Endpoint::parse(s, Role::Source).unwrap_or_else(|e| panic!("{s:?} as a source: {e}"))
}

fn dst(s: &str) -> Endpoint {
    Endpoint::parse(s, Role::Target).unwrap_or_else(|e| panic!("{s:?} as a target: {e}"))
}

/// Parses in both roles, asserting they agree (true of every name but /net ones and UDP URLs).
fn both(s: &str) -> Endpoint {
    let e = src(s);
    assert_eq!(dst(s), e, "{s:?}: roles disagree");
    e
}

fn err(s: &str, role: Role) -> EndpointError {
    match Endpoint::parse(s, role) {
        Ok(e) => panic!("{s:?} as a {role} was accepted as {e:?}"),
        Err(e) => {
            // Every refusal shows what is accepted.
            let msg = e.to_string();
            assert!(
                msg.ends_with(ACCEPTED_FORMS),
                "{s:?}: message lacks the forms: {msg}"
            );
            e
        }
    }
}

fn err_both(s: &str) -> EndpointError {
    let e = err(s, Role::Source);
    assert_eq!(err(s, Role::Target), e, "{s:?}: roles refuse differently");
    e
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> Host {
    Host::Ip(IpAddr::V4(Ipv4Addr::new(a, b, c, d)))
}

fn name(s: &str) -> Host {
    Host::Name(DnsName::parse(s).unwrap())
}

fn file(p: &str) -> Endpoint {
    Endpoint::File {
        path: PathBuf::from(p),
    }
}

// ---- accepted forms ---------------------------------------------------------------------

#[test]
fn files_bare_and_with_file_scheme() {
    for p in ["/tmp/movie.mpg", "movie.mpg", "./a", "/dev/sda", "a/b/c"] {
        assert_eq!(both(p), file(p));
        assert_eq!(both(&format!("file:{p}")), file(p));
    }
}

#[test]
fn odd_but_valid_file_names_stay_files() {
    for p in [
        "./a:b",
        "a:b",
        "C:\\movies\\x.mpg",
        "my movie.mpg",
        " leading space",
        "trailing space ",
        "vidéo-日本.mpg",
        "notes: draft.txt",
        "http:foo",
        "/net",
        "/net/udpx/4000",
        "/net/ip/4000",
        "net/udp/4000",
        "./net/udp/4000",
        "//net/udp/4000",
        "--",
        "-x",
        "1abc://x",
        "@sock",
        "::1",
    ] {
        assert_eq!(both(p), file(p), "{p:?}");
    }
}

#[test]
fn file_scheme_names_files_that_look_like_something_else() {
    for p in [
        "-",
        "tcp://h:1",
        "/net/udp/4000",
        "file:x",
        "vol:a/b",
        "tcp:x",
        "http://x",
    ] {
        assert_eq!(both(&format!("file:{p}")), file(p));
        assert_eq!(file(p).to_string(), format!("file:{p}"));
    }
    // "file:" is not a URL: the rest is the path, verbatim.
    assert_eq!(both("file:///tmp/x"), file("///tmp/x"));
}

#[test]
fn dash_is_stdio_in_both_roles() {
    assert_eq!(both("-"), Endpoint::Stdio);
    assert_eq!(Endpoint::Stdio.to_string(), "-");
}

#[test]
fn tcp_urls() {
    assert_eq!(
        both("tcp://127.0.0.1:8000"),
        Endpoint::TcpConnect {
            host: v4(127, 0, 0, 1),
            port: 8000,
            local_port: None
        }
    );
    assert_eq!(
        both("tcp://[::1]:65535"),
        Endpoint::TcpConnect {
            host: Host::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            port: 65535,
            local_port: None
        }
    );
    assert_eq!(
        both("tcp://Media.Example.COM:1"),
        Endpoint::TcpConnect {
            host: name("media.example.com"),
            port: 1,
            local_port: None
        }
    );
    assert_eq!(
        both("tcp-listen://0.0.0.0:9000"),
        Endpoint::TcpListen {
            host: v4(0, 0, 0, 0),
            port: 9000
        }
    );
    // Port 0: the kernel picks a free port, the driver reports it.
    assert_eq!(
        both("tcp-listen://localhost:0"),
        Endpoint::TcpListen {
            host: name("localhost"),
            port: 0
        }
    );
}

#[test]
fn udp_urls_have_one_role_each() {
    assert_eq!(
        dst("udp://10.0.0.2:5004"),
        Endpoint::UdpSend {
            host: v4(10, 0, 0, 2),
            port: 5004,
            local_port: None
        }
    );
    assert_eq!(
        src("udp-listen://[::]:0"),
        Endpoint::UdpListen {
            host: Host::Ip(IpAddr::V6(Ipv6Addr::UNSPECIFIED)),
            port: 0
        }
    );
    assert!(matches!(
        err("udp://10.0.0.2:5004", Role::Source),
        EndpointError::WrongRole {
            role: Role::Source,
            ..
        }
    ));
    assert!(matches!(
        err("udp-listen://0.0.0.0:5004", Role::Target),
        EndpointError::WrongRole {
            role: Role::Target,
            ..
        }
    ));
}

#[test]
fn unix_sockets() {
    assert_eq!(
        both("unix:/run/penstock.sock"),
        Endpoint::Unix {
            path: PathBuf::from("/run/penstock.sock")
        }
    );
    assert_eq!(
        both("unix-listen:rel.sock"),
        Endpoint::UnixListen {
            path: PathBuf::from("rel.sock")
        }
    );
    let longest = "s".repeat(UNIX_PATH_BYTES_MAX);
    assert_eq!(
        both(&format!("unix:{longest}")),
        Endpoint::Unix {
            path: PathBuf::from(&longest)
        }
    );
}

/// Issue 16: a volume named by a member's path, without PENSTOCK_VOLUMES.
#[test]
fn a_volume_may_be_named_by_a_members_absolute_path() {
    let e = both("vol:/srv/disks/m0.img/movies");
    let Endpoint::Volume { volume, partition } = &e else {
        panic!("{e:?}")
    };
    assert_eq!(volume.as_str(), "/srv/disks/m0.img");
    assert_eq!(partition.as_str(), "movies");
    assert_eq!(e.to_string(), "vol:/srv/disks/m0.img/movies");
    assert_eq!(both("vol:/m0/p").to_string(), "vol:/m0/p");
}

#[test]
fn volumes() {
    assert_eq!(
        both("vol:array0/movies-1.v2_x"),
        Endpoint::Volume {
            volume: VolumeName::parse("array0").unwrap(),
            partition: PartitionName::parse("movies-1.v2_x").unwrap(),
        }
    );
}

/// Roadrunner's Table 1, row by row, in the role each row's open mode maps to.
#[test]
fn descriptors() {
    assert_eq!(both("fd:0"), Endpoint::Fd { fd: 0 });
    assert_eq!(both("fd:7"), Endpoint::Fd { fd: 7 });
    assert_eq!(both("fd:2147483647"), Endpoint::Fd { fd: i32::MAX });
    // A file whose name starts with fd: is still reachable.
    assert_eq!(both("file:fd:3"), file("fd:3"));
    assert_eq!(both("./fd:3"), file("./fd:3"));
    assert_eq!(file("fd:3").to_string(), "file:fd:3");
}

#[test]
fn bad_descriptor_numbers_are_refused_not_taken_as_files() {
    for bad in [
        "fd:",
        "fd:-1",
        "fd:+1",
        "fd:07",
        "fd:2147483648",
        "fd:99999999999",
        "fd:x",
        "fd:1 ",
        "fd:1/2",
    ] {
        let e = err_both(bad);
        assert!(
            matches!(e, EndpointError::InvalidFd { .. }),
            "{bad:?}: {e:?}"
        );
        assert!(
            e.to_string().contains("file:"),
            "{bad:?}: the message names file:"
        );
    }
}

#[test]
fn roadrunner_table_1() {
    let lo = Host::LOCALHOST;
    let far = v4(128, 8, 130, 115);
    // O_RDONLY /4000: local port 4000 for reading.
    assert_eq!(
        src("/net/udp/4000"),
        Endpoint::UdpListen {
            host: lo.clone(),
            port: 4000
        }
    );
    // O_WRONLY and O_RDWR /2592: port 2592 on 127.0.0.1 for writing.
    assert_eq!(
        dst("/net/udp/2592"),
        Endpoint::UdpSend {
            host: lo.clone(),
            port: 2592,
            local_port: None
        }
    );
    // O_WRONLY and O_RDWR /128.8.130.115/2592: a foreign host for writing.
    assert_eq!(
        dst("/net/udp/128.8.130.115/2592"),
        Endpoint::UdpSend {
            host: far.clone(),
            port: 2592,
            local_port: None
        }
    );
    // O_RDWR /4000/2592: 127.0.0.1:2592 for writing, local port 4000 for reading.
    assert_eq!(
        dst("/net/udp/4000/2592"),
        Endpoint::UdpSend {
            host: lo.clone(),
            port: 2592,
            local_port: Some(4000)
        }
    );
    // O_RDWR /4000/128.8.130.115/2592.
    assert_eq!(
        dst("/net/udp/4000/128.8.130.115/2592"),
        Endpoint::UdpSend {
            host: far,
            port: 2592,
            local_port: Some(4000)
        }
    );
}

#[test]
fn net_udp_source_takes_only_a_port() {
    for s in [
        "/net/udp/128.8.130.115/2592",
        "/net/udp/4000/2592",
        "/net/udp/4000/host/2592",
    ] {
        assert!(
            matches!(
                err(s, Role::Source),
                EndpointError::WrongRole {
                    role: Role::Source,
                    ..
                }
            ),
            "{s:?}"
        );
    }
    // A receiver may let the kernel choose its port.
    assert_eq!(
        src("/net/udp/0"),
        Endpoint::UdpListen {
            host: Host::LOCALHOST,
            port: 0
        }
    );
}

#[test]
fn net_tcp_forms() {
    let lo = Host::LOCALHOST;
    assert_eq!(
        src("/net/tcp/4000"),
        Endpoint::TcpListen {
            host: lo.clone(),
            port: 4000
        }
    );
    assert_eq!(
        src("/net/tcp/0"),
        Endpoint::TcpListen {
            host: lo.clone(),
            port: 0
        }
    );
    assert_eq!(
        dst("/net/tcp/2592"),
        Endpoint::TcpConnect {
            host: lo.clone(),
            port: 2592,
            local_port: None
        }
    );
    assert_eq!(
        both("/net/tcp/media.example.com/2592"),
        Endpoint::TcpConnect {
            host: name("media.example.com"),
            port: 2592,
            local_port: None
        }
    );
    assert_eq!(
        both("/net/tcp/4000/2592"),
        Endpoint::TcpConnect {
            host: lo,
            port: 2592,
            local_port: Some(4000)
        }
    );
    assert_eq!(
        both("/net/tcp/4000/10.1.2.3/2592"),
        Endpoint::TcpConnect {
            host: v4(10, 1, 2, 3),
            port: 2592,
            local_port: Some(4000)
        }
    );
    // IPv6 with or without brackets: '/' separates the parts.
    let v6 = Endpoint::TcpConnect {
        host: Host::Ip(IpAddr::V6(Ipv6Addr::LOCALHOST)),
        port: 80,
        local_port: None,
    };
    assert_eq!(both("/net/tcp/::1/80"), v6);
    assert_eq!(both("/net/tcp/[::1]/80"), v6);
}

// ---- refusals ---------------------------------------------------------------------------

#[test]
fn empty_and_nul_are_refused() {
    assert_eq!(err_both(""), EndpointError::Empty);
    for s in ["\0", "a\0b", "tcp://h:1\0", "file:\0"] {
        assert!(matches!(err_both(s), EndpointError::Nul { .. }), "{s:?}");
    }
}

#[test]
fn unknown_schemes_are_refused() {
    for (s, scheme) in [
        ("http://example.com/x", "http"),
        ("TCP://h:1", "TCP"),
        ("udp6://h:1", "udp6"),
        ("sctp://h:1", "sctp"),
        ("C://x", "C"),
        ("a+b.c-d://", "a+b.c-d"),
    ] {
        match err_both(s) {
            EndpointError::UnknownScheme { scheme: got, .. } => assert_eq!(got, scheme),
            other => panic!("{s:?}: {other:?}"),
        }
    }
}

#[test]
fn known_schemes_without_slashes_are_refused_not_taken_as_files() {
    for s in [
        "tcp:h:80",
        "udp:",
        "tcp-listen:0.0.0.0:1",
        "udp-listen:x",
        "tcp:/x",
    ] {
        assert!(
            matches!(err_both(s), EndpointError::MissingSlashes { .. }),
            "{s:?}"
        );
    }
    assert!(err_both("tcp:h:80").to_string().contains("file:tcp:h:80"));
}

#[test]
fn missing_ports_are_refused() {
    for s in [
        "tcp://h",
        "tcp://h:",
        "tcp-listen://[::1]",
        "tcp://",
        "/net/tcp",
        "/net/tcp/",
        "/net/udp/4000/",
    ] {
        assert!(
            matches!(err(s, Role::Target), EndpointError::MissingPort { .. }),
            "{s:?}: {:?}",
            Endpoint::parse(s, Role::Target)
        );
    }
}

#[test]
fn invalid_ports_are_refused() {
    for s in [
        "tcp://h:65536",
        "tcp://h:99999999999999999999",
        "tcp://h:-1",
        "tcp://h:+80",
        "tcp://h:080",
        "tcp://h:00",
        "tcp://h:8o",
        "tcp://h: 80",
        "tcp://h:80 ",
        "tcp://[::1]x",
        "tcp://[::1]/80",
        "/net/tcp/http",
        "/net/tcp/70000",
        "/net/udp/4000/h/65536",
    ] {
        assert!(
            matches!(err(s, Role::Target), EndpointError::InvalidPort { .. }),
            "{s:?}: {:?}",
            Endpoint::parse(s, Role::Target)
        );
    }
}

#[test]
fn trailing_garbage_is_refused() {
    for s in [
        "tcp://h:80/",
        "tcp://h:80/path",
        "tcp://h:80?x=1",
        "tcp://h:80#f",
        "udp://h:80:81",
        "tcp://[::1]:80x",
    ] {
        let e = err(s, Role::Target);
        assert!(
            matches!(
                e,
                EndpointError::InvalidPort { .. } | EndpointError::InvalidHost { .. }
            ),
            "{s:?}: {e:?}"
        );
    }
}

#[test]
fn port_zero_is_refused_where_a_peer_port_is_needed() {
    for s in [
        "tcp://h:0",
        "udp://h:0",
        "/net/udp/0",
        "/net/tcp/0",
        "/net/udp/h/0",
        "/net/tcp/4000/h/0",
    ] {
        assert!(
            matches!(err(s, Role::Target), EndpointError::ZeroPort { .. }),
            "{s:?}"
        );
    }
    assert!(matches!(
        err("/net/tcp/h/0", Role::Source),
        EndpointError::ZeroPort { .. }
    ));
    for s in ["/net/udp/0/2592", "/net/tcp/0/h/80"] {
        assert!(
            matches!(err(s, Role::Target), EndpointError::ZeroLocalPort { .. }),
            "{s:?}"
        );
    }
}

#[test]
fn bad_hosts_are_refused() {
    for s in [
        "tcp://:80",
        "tcp://::1:80",
        "tcp://[::1:80",
        "tcp://[1.2.3.4]:80",
        "tcp://[fe80::1%eth0]:80",
        "tcp://[zz]:80",
        "tcp://1.2.3.256:80",
        "tcp://1.2.3:80",
        "tcp://4000:80",
        "tcp://a..b:80",
        "tcp://a.b.:80",
        "tcp://.a:80",
        "tcp://-a.b:80",
        "tcp://a-.b:80",
        "tcp://a_b:80",
        "tcp://a b:80",
        "tcp://user@h:80",
        "tcp://h/x:80",
        "tcp://ex\u{e4}mple.com:80",
        "/net/udp/bad_host/80",
        "/net/udp//80",
        "/net/udp/4000/1.2.3.999/80",
    ] {
        assert!(
            matches!(err(s, Role::Target), EndpointError::InvalidHost { .. }),
            "{s:?}: {:?}",
            Endpoint::parse(s, Role::Target)
        );
    }
    let label = "a".repeat(DNS_LABEL_BYTES_MAX + 1);
    assert!(matches!(
        err(&format!("tcp://{label}:80"), Role::Target),
        EndpointError::InvalidHost { .. }
    ));
    let long_name = vec!["a".repeat(63); 4].join(".");
    assert_eq!(long_name.len(), 255);
    assert!(matches!(
        err(&format!("tcp://{long_name}:80"), Role::Target),
        EndpointError::InvalidHost { .. }
    ));
    // The limits themselves are accepted.
    let ok_label = "a".repeat(DNS_LABEL_BYTES_MAX);
    dst(&format!("tcp://{ok_label}.b:80"));
    let ok_name = format!("{}.{}", vec!["a".repeat(63); 3].join("."), "b".repeat(61));
    assert_eq!(ok_name.len(), DNS_NAME_BYTES_MAX);
    dst(&format!("tcp://{ok_name}:80"));
}

#[test]
fn net_names_with_too_many_parts_are_refused() {
    for s in [
        "/net/udp/1/2/3/4",
        "/net/tcp/4000/h/80/",
        "/net/udp/a/b/c/d/e/f",
    ] {
        assert!(
            matches!(err_both(s), EndpointError::TooManyParts { .. }),
            "{s:?}"
        );
    }
}

#[test]
fn volumes_need_a_partition_and_clean_names() {
    for s in [
        "vol:",
        "vol:array0",
        "vol:array0/",
        "vol:/movies",
        "vol:/m0/",
        "vol:/m 0/p",
        "vol:/m0/../",
        "vol:a/b/c",
        "vol:a b/c",
        "vol:./c",
        "vol:a/..",
        "vol:\u{e9}/c",
    ] {
        assert!(
            matches!(err_both(s), EndpointError::InvalidVolume { .. }),
            "{s:?}"
        );
    }
    let long = "v".repeat(VOLUME_NAME_BYTES_MAX + 1);
    assert!(matches!(
        err_both(&format!("vol:{long}/p")),
        EndpointError::InvalidVolume { .. }
    ));
}

#[test]
fn empty_and_overlong_paths_are_refused() {
    for s in ["file:", "unix:", "unix-listen:"] {
        assert!(
            matches!(err_both(s), EndpointError::EmptyPath { .. }),
            "{s:?}"
        );
    }
    let long = "p".repeat(PATH_BYTES_MAX + 1);
    assert_eq!(
        err_both(&long),
        EndpointError::PathTooLong {
            len: PATH_BYTES_MAX + 1,
            max: PATH_BYTES_MAX
        }
    );
    assert_eq!(both(&long[1..]), file(&long[1..]));
    let sock = "s".repeat(UNIX_PATH_BYTES_MAX + 1);
    assert_eq!(
        err_both(&format!("unix:{sock}")),
        EndpointError::PathTooLong {
            len: UNIX_PATH_BYTES_MAX + 1,
            max: UNIX_PATH_BYTES_MAX
        }
    );
}

#[test]
fn error_messages_name_the_input_and_the_accepted_forms() {
    let msg = err("udp://h:0", Role::Target).to_string();
    assert!(msg.contains("\"udp://h:0\""), "{msg}");
    assert!(msg.contains("port 0"), "{msg}");
    for form in [
        "tcp://HOST:PORT",
        "tcp-listen://HOST:PORT",
        "udp://HOST:PORT",
        "udp-listen://HOST:PORT",
        "unix:PATH",
        "vol:VOLUME/PARTITION",
        "/net/udp/PORT",
        "/net/udp/[LOCALPORT/]HOST/PORT",
        "/net/tcp/PORT",
        "file:PATH",
    ] {
        assert!(msg.contains(form), "{form} missing from: {msg}");
    }
}

// ---- helpers ----------------------------------------------------------------------------

#[test]
fn kind_and_classification_helpers() {
    let cases = [
        ("movie.mpg", Role::Source, EndpointKind::File, "file"),
        ("-", Role::Source, EndpointKind::Stdio, "stdio"),
        (
            "tcp://h:1",
            Role::Source,
            EndpointKind::TcpConnect,
            "tcp-connect",
        ),
        (
            "tcp-listen://h:1",
            Role::Source,
            EndpointKind::TcpListen,
            "tcp-listen",
        ),
        ("udp://h:1", Role::Target, EndpointKind::UdpSend, "udp-send"),
        (
            "udp-listen://h:1",
            Role::Source,
            EndpointKind::UdpListen,
            "udp-listen",
        ),
        ("unix:s", Role::Source, EndpointKind::Unix, "unix"),
        (
            "unix-listen:s",
            Role::Source,
            EndpointKind::UnixListen,
            "unix-listen",
        ),
        ("vol:v/p", Role::Source, EndpointKind::Volume, "volume"),
        ("fd:3", Role::Target, EndpointKind::Fd, "fd"),
    ];
    for (s, role, kind, kind_name) in cases {
        let e = Endpoint::parse(s, role).unwrap();
        assert_eq!(e.kind(), kind);
        assert_eq!(kind.to_string(), kind_name);
        let udp = s.starts_with("udp");
        let socket = s.starts_with("tcp") || udp || s.starts_with("unix");
        assert_eq!(e.is_socket(), socket, "{s}");
        assert_eq!(e.is_datagram(), udp, "{s}");
        assert_eq!(e.is_stream_socket(), socket && !udp, "{s}");
        assert_eq!(
            e.is_storage(),
            matches!(kind, EndpointKind::File | EndpointKind::Volume)
        );
        assert_eq!(e.is_listener(), s.contains("listen:"), "{s}");
        assert!(e.supports(role));
        assert_eq!(
            e.supports(match role {
                Role::Source => Role::Target,
                Role::Target => Role::Source,
            }),
            !udp,
            "{s}"
        );
    }
}

#[test]
fn display_is_canonical() {
    for (input, role, shown) in [
        ("file:movie.mpg", Role::Source, "movie.mpg"),
        ("tcp://EXAMPLE.com:80", Role::Target, "tcp://example.com:80"),
        ("/net/tcp/80", Role::Target, "tcp://127.0.0.1:80"),
        ("/net/tcp/::1/80", Role::Target, "tcp://[::1]:80"),
        ("/net/tcp/80", Role::Source, "tcp-listen://127.0.0.1:80"),
        ("/net/udp/4000", Role::Source, "udp-listen://127.0.0.1:4000"),
        (
            "/net/udp/4000/2592",
            Role::Target,
            "/net/udp/4000/127.0.0.1/2592",
        ),
        (
            "/net/udp/4000/[::1]/2592",
            Role::Target,
            "/net/udp/4000/[::1]/2592",
        ),
        ("/net/tcp/4000/h/2592", Role::Source, "/net/tcp/4000/h/2592"),
        ("file:-", Role::Source, "file:-"),
    ] {
        let e = Endpoint::parse(input, role).unwrap();
        assert_eq!(e.to_string(), shown, "{input:?}");
        assert_eq!(Endpoint::parse(shown, role), Ok(e), "{shown:?}");
    }
}

// ---- properties -------------------------------------------------------------------------

fn arb_host() -> impl Strategy<Value = Host> {
    prop_oneof![
        any::<Ipv4Addr>().prop_map(|a| Host::Ip(IpAddr::V4(a))),
        any::<Ipv6Addr>().prop_map(|a| Host::Ip(IpAddr::V6(a))),
        // Labels of letters, digits and inner hyphens; the last one starts with a letter so the
        // name is never all digits. Mixed case: the parser stores lower case.
        "([A-Za-z0-9]([A-Za-z0-9-]{0,8}[A-Za-z0-9])?\\.){0,3}[A-Za-z][A-Za-z0-9-]{0,8}[A-Za-z0-9]"
            .prop_map(|s| Host::Name(DnsName::parse(&s).unwrap())),
    ]
}

/// Paths, including ones that look like other forms (which display with `file:`).
fn arb_path(max: usize) -> impl Strategy<Value = PathBuf> {
    prop_oneof![
        "[^\0]{1,40}",
        "[a-z/.: -]{1,20}",
        Just("-".to_string()),
        Just("tcp://h:1".to_string()),
        Just("/net/udp/4000".to_string()),
        Just("/net/tcp".to_string()),
        Just("file:".to_string()),
        Just("vol:a/b".to_string()),
        Just("x://y".to_string()),
        Just("udp:z".to_string()),
        Just("fd:3".to_string()),
    ]
    .prop_filter("path length", move |s| s.len() <= max)
    .prop_map(PathBuf::from)
}

fn arb_volume_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,64}".prop_filter("not . or ..", |s| s != "." && s != "..")
}

fn arb_endpoint() -> impl Strategy<Value = Endpoint> {
    let peer_port = 1..=u16::MAX;
    let local_port = proptest::option::of(1..=u16::MAX);
    prop_oneof![
        arb_path(PATH_BYTES_MAX).prop_map(|path| Endpoint::File { path }),
        Just(Endpoint::Stdio),
        (arb_host(), peer_port.clone(), local_port.clone()).prop_map(|(host, port, local_port)| {
            Endpoint::TcpConnect {
                host,
                port,
                local_port,
            }
        }),
        (arb_host(), any::<u16>()).prop_map(|(host, port)| Endpoint::TcpListen { host, port }),
        (arb_host(), peer_port, local_port).prop_map(|(host, port, local_port)| {
            Endpoint::UdpSend {
                host,
                port,
                local_port,
            }
        }),
        (arb_host(), any::<u16>()).prop_map(|(host, port)| Endpoint::UdpListen { host, port }),
        arb_path(UNIX_PATH_BYTES_MAX).prop_map(|path| Endpoint::Unix { path }),
        arb_path(UNIX_PATH_BYTES_MAX).prop_map(|path| Endpoint::UnixListen { path }),
        (arb_volume_name(), arb_volume_name()).prop_map(|(v, p)| Endpoint::Volume {
            volume: VolumeName::parse(&v).unwrap(),
            partition: PartitionName::parse(&p).unwrap(),
        }),
        (0..=i32::MAX).prop_map(|fd| Endpoint::Fd { fd }),
    ]
}

/// Strings assembled from the grammar's own pieces, so that random input reaches deep into
/// the parser instead of stopping at "unknown form → file".
fn arb_name_like() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("tcp://"),
        Just("tcp-listen://"),
        Just("udp://"),
        Just("udp-listen://"),
        Just("unix:"),
        Just("unix-listen:"),
        Just("vol:"),
        Just("fd:"),
        Just("file:"),
        Just("/net/udp"),
        Just("/net/tcp"),
        Just("/"),
        Just(":"),
        Just("["),
        Just("]"),
        Just("::1"),
        Just("."),
        Just("-"),
        Just("0"),
        Just("4000"),
        Just("65535"),
        Just("65536"),
        Just("127.0.0.1"),
        Just("host"),
        Just("é"),
        Just("\0"),
        Just(" "),
        Just("%"),
        Just("x://"),
    ];
    proptest::collection::vec(piece, 0..8).prop_map(|v| v.concat())
}

fn arb_role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Source), Just(Role::Target)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    /// Every valid endpoint displays as a name that parses back to it, in each role it
    /// supports.
    #[test]
    fn display_then_parse_round_trips(e in arb_endpoint()) {
        let shown = e.to_string();
        let mut roles = 0;
        for role in ROLES {
            if e.supports(role) {
                roles += 1;
                prop_assert_eq!(Endpoint::parse(&shown, role), Ok(e.clone()), "{:?}", shown);
            }
        }
        prop_assert!(roles > 0);
    }

    /// Parsing never panics, and what it accepts is a fixed point of display-then-parse and
    /// supports the role it was parsed for.
    #[test]
    fn parse_is_total_and_display_is_a_fixed_point(
        s in prop_oneof!["\\PC*", ".*", arb_name_like()],
        role in arb_role(),
    ) {
        match Endpoint::parse(&s, role) {
            Ok(e) => {
                prop_assert!(e.supports(role));
                let shown = e.to_string();
                prop_assert_eq!(Endpoint::parse(&shown, role), Ok(e.clone()), "{:?} -> {:?}", s, shown);
            }
            Err(err) => {
                let msg = err.to_string();
                prop_assert!(msg.ends_with(ACCEPTED_FORMS));
            }
        }
    }

    /// Any string with no known prefix is a file, whatever it holds (within Linux's limits).
    #[test]
    fn strings_without_a_known_prefix_are_files(s in "[^\0]{1,60}") {
        prop_assume!(matches!(classify(&s), Syntax::Path(_)));
        for role in ROLES {
            prop_assert_eq!(Endpoint::parse(&s, role), Ok(file(&s)));
        }
    }
}
