//! How `sparrow serve` reads the values of the flags it shares with SGLang: as
//! `sglang.launch_server`'s argparse reads them, so that an SGLang command line means the
//! same here. Integers are Python `int()` literals; the token counts SGLang parses with
//! `human_readable_int` also take its SI/IEC suffixes (`16k`, `1Mi`); `--chunked-prefill-size`
//! at or below zero turns chunked prefill off.

/// `--chunked-prefill-size`: a chunk size, or chunked prefill off (`-1`, or any value <= 0,
/// as SGLang's scheduler reads it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkedPrefill {
    /// Prompts are not split into chunks of their own: a step prefills up to
    /// `--max-prefill-tokens` (the engine's one per-step prefill budget).
    Off,
    /// A prompt is prefilled at most this many tokens per step.
    Tokens(usize),
}

impl ChunkedPrefill {
    /// The value as SGLang reports it (`/get_server_info`): the size, or -1 when off.
    pub fn sglang_value(self) -> i64 {
        match self {
            ChunkedPrefill::Off => -1,
            ChunkedPrefill::Tokens(n) => i64::try_from(n).unwrap_or(i64::MAX),
        }
    }

    /// The chunk size the engine is given. The engine has no "off": each step prefills at
    /// most `min(chunk size, max_prefill_tokens)` tokens, so off is a chunk size equal to the
    /// per-step budget, the largest that can make a difference.
    pub fn engine_chunk(self, max_prefill_tokens: usize) -> usize {
        match self {
            ChunkedPrefill::Off => max_prefill_tokens,
            ChunkedPrefill::Tokens(n) => n,
        }
    }
}

/// clap value parser of `--chunked-prefill-size` (SGLang `type=int`).
pub fn chunked_prefill(s: &str) -> Result<ChunkedPrefill, String> {
    let v = py_int(s)?;
    if v <= 0 {
        return Ok(ChunkedPrefill::Off);
    }
    usize::try_from(v).map(ChunkedPrefill::Tokens).map_err(|_| format!("{v} is too large"))
}

/// Python's `int(s)`: surrounding whitespace, an optional sign, decimal digits with single
/// underscores between them.
pub fn py_int(s: &str) -> Result<i128, String> {
    let t = s.trim();
    let (neg, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let well_formed = !digits.is_empty()
        && !digits.starts_with('_')
        && !digits.ends_with('_')
        && !digits.contains("__")
        && digits.chars().all(|c| c.is_ascii_digit() || c == '_');
    let plain: String = digits.chars().filter(|&c| c != '_').collect();
    match plain.parse::<i128>() {
        Ok(v) if well_formed => Ok(if neg { -v } else { v }),
        _ => Err(format!("invalid int value: '{s}'")),
    }
}

/// SGLang's `human_readable_int`: a Python int, or a number with a case-sensitive SI suffix
/// (`k`, `M`, `G`, `T`; decimals allowed, truncated: `25.6k` is 25600) or IEC suffix (`Ki`,
/// `Mi`, `Gi`, `Ti`; integers only).
pub fn human_readable_int(s: &str) -> Result<i128, String> {
    let t = s.trim();
    const SUFFIXES: [(&str, u128, bool); 8] = [
        ("Ki", 1 << 10, true),
        ("Mi", 1 << 20, true),
        ("Gi", 1 << 30, true),
        ("Ti", 1 << 40, true),
        ("k", 1_000, false),
        ("M", 1_000_000, false),
        ("G", 1_000_000_000, false),
        ("T", 1_000_000_000_000, false),
    ];
    for (suffix, mult, iec) in SUFFIXES {
        let Some(number) = t.strip_suffix(suffix) else { continue };
        // SGLang's pattern: `\d+(\.\d+)?` before the suffix (no sign, no underscores).
        let (int_part, frac) = number.split_once('.').unwrap_or((number, ""));
        let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
        if !digits(int_part) || (number.contains('.') && !digits(frac)) {
            break;
        }
        if iec && !frac.is_empty() {
            return Err(format!(
                "decimals are not allowed with IEC suffixes like '{suffix}' (got '{s}'); use an integer, \
                 or the SI suffix '{}'",
                &suffix[..1]
            ));
        }
        let too_large = || format!("'{s}' is too large");
        let int: u128 = int_part.parse().map_err(|_| too_large())?;
        let scale = 10u128.checked_pow(frac.len() as u32).ok_or_else(too_large)?;
        let frac_v: u128 = if frac.is_empty() { 0 } else { frac.parse().map_err(|_| too_large())? };
        let v = int
            .checked_mul(scale)
            .and_then(|x| x.checked_add(frac_v))
            .and_then(|x| x.checked_mul(mult))
            .map(|x| x / scale)
            .ok_or_else(too_large)?;
        return i128::try_from(v).map_err(|_| too_large());
    }
    py_int(t).map_err(|_| {
        format!(
            "invalid integer value: '{s}' (a plain integer, SI suffixes 1k, 1M, or IEC suffixes 1Ki, 1Mi; \
             suffixes are case-sensitive)"
        )
    })
}

/// clap value parser of a token count SGLang reads with `human_readable_int` into a field
/// that must not be negative here.
pub fn token_count(s: &str) -> Result<usize, String> {
    let v = human_readable_int(s)?;
    usize::try_from(v).map_err(|_| format!("{v} is not a token count (must be 0 or more)"))
}

/// clap value parser of a non-negative SGLang `type=int` flag.
pub fn count(s: &str) -> Result<usize, String> {
    let v = py_int(s)?;
    usize::try_from(v).map_err(|_| format!("{v} must be 0 or more"))
}

/// clap value parser of a timeout in seconds: a finite number from 0 (off) to a year.
pub fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if !(0.0..=31_536_000.0).contains(&v) {
        return Err(format!("{v} must be between 0 (off) and 31536000 seconds"));
    }
    Ok(v)
}

/// A [`seconds`] value as a timeout: `None` for 0 (off).
pub fn timeout(secs: f64) -> Option<std::time::Duration> {
    (secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_in_seconds() {
        assert_eq!(seconds("30"), Ok(30.0));
        assert_eq!(seconds("0.5"), Ok(0.5));
        assert_eq!(timeout(0.0), None);
        assert_eq!(timeout(2.5), Some(std::time::Duration::from_millis(2500)));
        for bad in ["", "-1", "nan", "inf", "1e9", "5s"] {
            assert!(seconds(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn python_ints() {
        assert_eq!(py_int(" 42 "), Ok(42));
        assert_eq!(py_int("+7"), Ok(7));
        assert_eq!(py_int("-1"), Ok(-1));
        assert_eq!(py_int("1_000"), Ok(1000));
        for bad in ["", "1__0", "_1", "1_", "1.5", "0x10", "1k"] {
            assert!(py_int(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn sglang_human_readable_ints() {
        assert_eq!(human_readable_int("1k"), Ok(1000));
        assert_eq!(human_readable_int("25.6k"), Ok(25_600));
        assert_eq!(human_readable_int("1.0005k"), Ok(1000), "truncated as int(Decimal(..))");
        assert_eq!(human_readable_int("1M"), Ok(1_000_000));
        assert_eq!(human_readable_int("1Ki"), Ok(1024));
        assert_eq!(human_readable_int("2Mi"), Ok(2 << 20));
        assert_eq!(human_readable_int("16384"), Ok(16384));
        assert!(human_readable_int("1.5Ki").expect_err("IEC decimal").contains("decimals"));
        for bad in ["1K", "1m", "k", "-1k", "1 k", "x"] {
            assert!(human_readable_int(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn chunked_prefill_off_at_or_below_zero() {
        assert_eq!(chunked_prefill("-1"), Ok(ChunkedPrefill::Off));
        assert_eq!(chunked_prefill("0"), Ok(ChunkedPrefill::Off));
        assert_eq!(chunked_prefill("512"), Ok(ChunkedPrefill::Tokens(512)));
        assert!(chunked_prefill("2k").is_err(), "SGLang reads this flag with int()");
        assert_eq!(ChunkedPrefill::Off.sglang_value(), -1);
        assert_eq!(ChunkedPrefill::Off.engine_chunk(16384), 16384);
        assert_eq!(ChunkedPrefill::Tokens(256).engine_chunk(16384), 256);
    }
}
