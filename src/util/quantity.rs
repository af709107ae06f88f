//! Kubernetes resource quantities (`10Gi`, `500M`, `1.5Ti`, `1e9`) as bytes, for comparing sizes.

/// Parses a quantity into a number of bytes (rounded down). `None` when it is not a quantity.
pub fn parse_bytes(q: &str) -> Option<u128> {
    let q = q.trim();
    if q.is_empty() {
        return None;
    }
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(q.len());
    let (num, suffix) = q.split_at(split);
    let (num, exp10): (&str, i32) = if let Some(rest) = suffix.strip_prefix(['e', 'E']) {
        (num, rest.parse().ok()?)
    } else {
        (num, 0)
    };
    let mult: u128 = match if exp10 != 0 { "" } else { suffix } {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        "Ei" => 1 << 60,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "E" => 1_000_000_000_000_000_000,
        _ => return None,
    };
    let num = num.strip_prefix('+').unwrap_or(num);
    if num.is_empty() || num.matches('.').count() > 1 || num == "." {
        return None;
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let int: u128 = if int_part.is_empty() {
        0
    } else {
        int_part.parse().ok()?
    };
    let mut value = int.checked_mul(mult)?;
    if !frac_part.is_empty() {
        let frac: u128 = frac_part.parse().ok()?;
        let scale = 10u128.checked_pow(frac_part.len() as u32)?;
        value = value.checked_add(frac.checked_mul(mult)? / scale)?;
    }
    if exp10 > 0 {
        value = value.checked_mul(10u128.checked_pow(exp10 as u32)?)?;
    } else if exp10 < 0 {
        value /= 10u128.checked_pow((-exp10) as u32)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::parse_bytes;

    #[test]
    fn parses_binary_decimal_and_fractional_quantities() {
        assert_eq!(parse_bytes("10Gi"), Some(10 << 30));
        assert_eq!(parse_bytes("1G"), Some(1_000_000_000));
        assert_eq!(parse_bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(parse_bytes("512Mi"), Some(512 << 20));
        assert_eq!(parse_bytes("1024"), Some(1024));
        assert_eq!(parse_bytes("1e3"), Some(1000));
        assert!(parse_bytes("2Gi") > parse_bytes("2G"));
    }

    #[test]
    fn rejects_what_is_not_a_quantity() {
        for bad in ["", "Gi", "ten", "10GB", "1..5Gi", "-1Gi", "10 Gi"] {
            assert_eq!(parse_bytes(bad), None, "{bad:?}");
        }
    }
}
