//! Excerpts of text the operator reports but does not write (a server's error, a log line).

/// `text` up to ClickHouse's stack trace (`, e.what()`, `Stack trace`, the first line break),
/// without trailing separators, at most `max` bytes (cut at a character boundary).
pub fn excerpt(text: &str, max: usize) -> &str {
    let text = [", e.what()", "Stack trace", "\n"]
        .iter()
        .filter_map(|cut| text.find(cut))
        .min()
        .map_or(text, |i| &text[..i])
        .trim_end_matches([',', ' ', '.']);
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::excerpt;

    #[test]
    fn an_excerpt_stops_before_the_stack_trace_and_at_a_character_boundary() {
        assert_eq!(
            excerpt(
                "Code: 999, Not authenticated, path: /x, e.what() = E, Stack trace:\n1. f",
                300
            ),
            "Code: 999, Not authenticated, path: /x"
        );
        assert_eq!(excerpt(&"é".repeat(10), 5), "éé");
    }
}
