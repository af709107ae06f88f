//! Small helpers: running commands, quoting, time stamps, base64.

use anyhow::{Result, bail};
use std::path::{Path, PathBuf};

/// Runs a command, failing with its stderr when it exits non-zero.
pub async fn run(prog: &str, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "{prog} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command, ignoring failure (for cleanup).
pub async fn run_quiet(prog: &str, args: &[&str]) -> bool {
    tokio::process::Command::new(prog)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .await
        .map(|s| s.success())
        .unwrap_or(false)
}

pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

pub fn b64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = ((b[0] as u32) << 16) | ((b[1] as u32) << 8) | b[2] as u32;
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

pub fn der_to_pem(der: &[u8]) -> String {
    let b = b64(der);
    let mut s = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b.as_bytes().chunks(64) {
        s.push_str(std::str::from_utf8(line).unwrap_or_default());
        s.push('\n');
    }
    s.push_str("-----END CERTIFICATE-----\n");
    s
}

/// uid, gid and home of a user of this machine.
pub fn lookup_user(name: &str) -> Option<(u32, u32, String)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 6 && f[0] == name {
            return Some((f[2].parse().ok()?, f[3].parse().ok()?, f[5].to_string()));
        }
    }
    None
}

pub fn user_by_uid(uid: u32) -> Option<(String, u32, String)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 6 && f[2].parse::<u32>().ok() == Some(uid) {
            return Some((f[0].to_string(), f[3].parse().ok()?, f[5].to_string()));
        }
    }
    None
}

pub fn chown(path: &Path, uid: Option<u32>, gid: Option<u32>) {
    let _ = std::os::unix::fs::chown(path, uid, gid);
}

/// chown -R (does not follow symlinks)
pub fn chown_recursive(path: &Path, uid: Option<u32>, gid: Option<u32>) {
    let _ = std::os::unix::fs::lchown(path, uid, gid);
    if let Ok(md) = std::fs::symlink_metadata(path)
        && md.is_dir()
        && let Ok(rd) = std::fs::read_dir(path)
    {
        for e in rd.flatten() {
            chown_recursive(&e.path(), uid, gid);
        }
    }
}

/// Copies a folder tree (regular files, folders, symlinks).
pub fn copy_tree(src: &Path, dst: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let ft = e.file_type()?;
        let to = dst.join(e.file_name());
        if ft.is_dir() {
            copy_tree(&e.path(), &to)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(e.path())?;
            let _ = std::fs::remove_file(&to);
            std::os::unix::fs::symlink(target, &to)?;
        } else if ft.is_file() {
            std::fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}

/// Records a path the agent created on the machine's own filesystem (a mount point), so that
/// cleanup can remove it again.
pub fn record_created(data_dir: &Path, p: &Path) {
    use std::io::Write;
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join("created-paths"))
    {
        let _ = writeln!(f, "{}", p.display());
    }
}

/// Creates `target` (a folder, or an empty file when `file`) on the machine's filesystem,
/// recording every path component it had to create.
pub fn ensure_mount_point(data_dir: &Path, target: &Path, file: bool) -> std::io::Result<()> {
    if target.exists() {
        return Ok(());
    }
    let mut missing: Vec<PathBuf> = Vec::new();
    let mut cur = target.to_path_buf();
    while !cur.exists() {
        missing.push(cur.clone());
        match cur.parent() {
            Some(p) => cur = p.to_path_buf(),
            None => break,
        }
    }
    missing.reverse();
    for (i, p) in missing.iter().enumerate() {
        if file && i == missing.len() - 1 {
            std::fs::write(p, b"")?;
        } else {
            std::fs::create_dir(p)?;
        }
        record_created(data_dir, p);
    }
    Ok(())
}

/// Expands `$(VAR)` references as the kubelet does (`$$` escapes).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' && i + 1 < b.len() && b[i + 1] == b'$' {
            out.push('$');
            i += 2;
        } else if b[i] == b'$' && i + 1 < b.len() && b[i + 1] == b'(' {
            if let Some(end) = s[i + 2..].find(')') {
                let name = &s[i + 2..i + 2 + end];
                if let Some((_, v)) = env.iter().rev().find(|(k, _)| k == name) {
                    out.push_str(v);
                } else {
                    out.push_str(&s[i..i + 3 + end]);
                }
                i += 3 + end;
            } else {
                out.push_str(&s[i..]);
                break;
            }
        } else {
            let ch = s[i..].chars().next().unwrap_or_default();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn base64() {
        assert_eq!(b64(b"hello"), "aGVsbG8=");
        assert_eq!(b64(b"hi!"), "aGkh");
        assert_eq!(b64(b"a"), "YQ==");
    }
    #[test]
    fn expansion() {
        let env = vec![("A".to_string(), "x".to_string())];
        assert_eq!(expand("$(A)-$(B)-$$(A)", &env), "x-$(B)-$(A)");
    }
}
