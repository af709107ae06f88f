//! Networks ClickHouse accounts may connect from (decision 27): addresses and CIDRs as ClickHouse's
//! `<networks><ip>` takes them, checked here so that a typo is refused with its field instead of
//! making ClickHouse reject the whole users file.

use std::net::IpAddr;

/// `a.b.c.d`, `a.b.c.d/len` (0..=32) or an IPv6 address with an optional `/len` (0..=128), in
/// the canonical form (`10.1.0.0/16`, `fd00::/8`); anything else is an error naming `field`.
pub fn parse(value: &str, field: &str) -> Result<String, String> {
    let v = value.trim();
    let (addr, len) = match v.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (v, None),
    };
    let ip: IpAddr = addr.parse().map_err(|_| {
        format!("{field}: {value:?} is not an address or network (such as 10.0.0.0/8 or fd00::/8)")
    })?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => match l.parse::<u8>() {
            Ok(n) if n <= max => n,
            _ => {
                return Err(format!(
                    "{field}: {value:?} has a prefix length that is not 0 to {max}"
                ));
            }
        },
    };
    Ok(format!("{}/{len}", network_of(ip, len)))
}

/// The network of `ip` with prefix `len` (the host bits cleared).
pub fn network_of(ip: IpAddr, len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(a) => {
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

/// The network guessed for the pods of a Kubernetes cluster from one pod's address: the /16
/// around an IPv4 address, the /64 around an IPv6 one.
pub fn pod_network_of(ip: IpAddr) -> String {
    let len = if ip.is_ipv4() { 16 } else { 64 };
    format!("{}/{len}", network_of(ip, len))
}

/// Whether `ip` lies in `network` (a canonical `address/len`, as [`parse`] writes it).
pub fn contains(network: &str, ip: IpAddr) -> bool {
    let Some((addr, len)) = network.split_once('/') else {
        return false;
    };
    match (addr.parse::<IpAddr>(), len.parse::<u8>()) {
        (Ok(base), Ok(len)) => base.is_ipv4() == ip.is_ipv4() && network_of(ip, len) == base,
        _ => false,
    }
}

/// Parses a comma-separated list (blanks and empty items ignored, duplicates removed, order
/// kept).
pub fn parse_list(value: &str, field: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let n = parse(item, field)?;
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decision 27: addresses and networks are checked and written canonically; garbage, a bad
    /// prefix or a host name is refused with the field named.
    #[test]
    fn networks_are_checked_and_canonical() {
        assert_eq!(parse("10.1.2.3/16", "f").unwrap(), "10.1.0.0/16");
        assert_eq!(parse(" 198.18.0.1 ", "f").unwrap(), "198.18.0.1/32");
        assert_eq!(parse("::/0", "f").unwrap(), "::/0");
        assert_eq!(parse("fd00:1::5/8", "f").unwrap(), "fd00::/8");
        assert_eq!(parse("0.0.0.0/0", "f").unwrap(), "0.0.0.0/0");
        for bad in [
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "host.example",
            "10.0.0",
            "",
            "::/129",
        ] {
            let e = parse(bad, "spec.users.networks").unwrap_err();
            assert!(e.starts_with("spec.users.networks: "), "{e}");
        }
        assert_eq!(
            parse_list(" 10.0.0.0/8, ,10.1.0.0/8,::1", "f").unwrap(),
            ["10.0.0.0/8", "::1/128"]
        );
        assert_eq!(
            pod_network_of("10.244.3.7".parse().unwrap()),
            "10.244.0.0/16"
        );
        assert_eq!(
            pod_network_of("fd00:10:244:1::7".parse().unwrap()),
            "fd00:10:244:1::/64"
        );
    }
}
