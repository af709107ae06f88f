//! The in-process operators' log: sent to the test's output, watched for secret values, and its
//! trail of info and warning lines kept.

/// Secret values no log line of the in-process operators may hold (see [`watch_for_secrets`]),
/// and the lines that held one.
static WATCHED: std::sync::Mutex<(Vec<String>, Vec<String>)> =
    std::sync::Mutex::new((Vec::new(), Vec::new()));

/// The operators' log writer: the test's output (shown for failed tests), each line also
/// checked for the secret values registered with [`watch_for_secrets`].
pub(super) struct LogTee;

impl std::io::Write for LogTee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        let mut watched = WATCHED.lock().unwrap();
        let (secrets, hits) = &mut *watched;
        if secrets.iter().any(|s| line.contains(s.as_str())) {
            hits.push(line.chars().take(300).collect());
        }
        drop(watched);
        let line = without_ansi(&line);
        if line.contains("pass{") && (line.contains(" INFO ") || line.contains(" WARN ")) {
            TRAIL.lock().unwrap().push(line);
        }
        tracing_subscriber::fmt::TestWriter::new().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The operators' info and warning lines logged within a pass (the log trail), without colours.
static TRAIL: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // an escape sequence: `ESC [ … letter`
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The info and warning lines of the in-process operators' passes so far that contain `needle`.
pub fn trail(needle: &str) -> Vec<String> {
    TRAIL
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.contains(needle))
        .cloned()
        .collect()
}

/// From now on, a log line of any in-process operator that holds one of `secrets` is recorded
/// (see [`logged_secrets`]).
pub fn watch_for_secrets(secrets: &[&str]) {
    let mut watched = WATCHED.lock().unwrap();
    for s in secrets {
        if !s.is_empty() && !watched.0.iter().any(|w| w == s) {
            watched.0.push(s.to_string());
        }
    }
}

/// The log lines that held a watched secret (the secret's value included: they are for a
/// failing test's message, on this machine).
pub fn logged_secrets() -> Vec<String> {
    WATCHED.lock().unwrap().1.clone()
}
