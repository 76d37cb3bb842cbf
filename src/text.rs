//! Bounding text: strings from peers and from the cluster are cut, on a character
//! boundary and with a visible mark, before they reach logs, events, statuses or frames.

/// Longest identifier from the control plane kept: `actor`, `session_id`, ids and the
/// names of a target. Longer ones are cut (with a mark) at decode, so logs and audit
/// events never carry a peer's megabyte.
pub const MAX_ID_BYTES: usize = 256;

/// Longest free text from the control plane kept: `reason`, `message`.
pub const MAX_TEXT_BYTES: usize = 1024;

/// Cuts `s` to at most `max` bytes on a character boundary.
pub fn cap_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// What [`cap_utf8_marked`] puts where it cut.
pub const CUT_MARK: &str = "…";

/// Cuts `s` to at most `max` bytes on a character boundary, the last three of them a
/// visible [`CUT_MARK`] when anything was cut. For strings from peers that reach logs,
/// audit events and frames. What was cut goes back to the allocator: a 1 MiB `id`
/// cut to 256 bytes must not hold its megabyte for as long as its control runs.
pub fn cap_utf8_marked(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let keep = cap_utf8(s, max.saturating_sub(CUT_MARK.len())).len();
    s.truncate(keep);
    if s.len() + CUT_MARK.len() <= max {
        s.push_str(CUT_MARK);
    }
    s.shrink_to_fit();
}

/// In tests: `got` is a marked cut of `want`, at most `max` bytes, a prefix of it, and
/// not shorter than a character boundary forces.
#[cfg(test)]
pub(crate) fn assert_cut(got: &str, want: &str, max: usize) {
    assert!(got.len() <= max, "{} > {max}", got.len());
    let kept = got.strip_suffix(CUT_MARK).expect("a visible mark");
    assert!(want.starts_with(kept));
    assert!(kept.len() + CUT_MARK.len() + 4 > max, "cut too short");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_utf8_respects_char_boundaries() {
        assert_eq!(cap_utf8("héllo", 2), "h");
        assert_eq!(cap_utf8("abc", 10), "abc");
    }

    #[test]
    fn cap_utf8_marked_table() {
        // (input, max, output): the output is at most `max` bytes and never splits a
        // character; the mark shows where something was cut.
        let table = [
            ("abc", 3, "abc"),
            ("abcd", 3, "…"),
            ("abcdef", 5, "ab…"),
            ("héllo", 5, "h…"),
            ("€€€", 8, "€…"),
            ("🦀🦀", 7, "🦀…"),
            ("🦀🦀", 6, "…"),
            ("abcd", 2, ""),
        ];
        for (input, max, want) in table {
            let mut s = input.to_owned();
            cap_utf8_marked(&mut s, max);
            assert_eq!((input, max, s.as_str()), (input, max, want));
            assert!(s.len() <= max);
        }
    }

    #[test]
    fn a_cut_string_gives_back_what_was_cut() {
        let mut s = "é".repeat(512 * 1024);
        cap_utf8_marked(&mut s, MAX_ID_BYTES);
        assert!(s.len() <= MAX_ID_BYTES);
        assert!(
            s.capacity() <= MAX_ID_BYTES,
            "{} bytes still held",
            s.capacity()
        );
    }
}
