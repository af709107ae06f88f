//! chDB (ClickHouse as a Python module, from PyPI), shared by the tests that check what the
//! operator generates against a current ClickHouse engine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The Python of the chDB environment (installed once per test process).
pub fn chdb_python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/hack/chdb.sh"))
            .output()
            .expect("run hack/chdb.sh");
        assert!(
            out.status.success(),
            "hack/chdb.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .last()
                .unwrap()
                .trim(),
        )
    })
}
