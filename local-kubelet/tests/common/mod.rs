//! The harness of the local cluster's tests: `hack/local-cluster.sh up` into a temporary folder
//! once per test binary, `down` at the end (also when a scenario fails or panics), then a check
//! that nothing of the cluster is left on the machine.
#![allow(dead_code)]

use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub struct Cluster {
    pub dir: PathBuf,
    pub bin: PathBuf,
    up: bool,
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/local-cluster.sh")
}

impl Cluster {
    /// `hack/local-cluster.sh up` with `nodes` nodes.
    pub fn start(nodes: u32) -> Result<Cluster> {
        let dir = std::env::temp_dir().join(format!("local-kubelet-test-{}", std::process::id()));
        let t0 = Instant::now();
        // what the agent runs for *clickhouse-operator* images in these tests
        std::fs::create_dir_all(&dir)?;
        let fake_operator = dir.join("fake-operator.sh");
        std::fs::write(&fake_operator, FAKE_OPERATOR)?;
        std::fs::set_permissions(
            &fake_operator,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )?;
        let st = Command::new("bash")
            .arg(script())
            .arg("up")
            .arg(&dir)
            .env("LOCAL_KUBELET_BIN", env!("CARGO_BIN_EXE_local-kubelet"))
            .env("CLICKHOUSE_OPERATOR_BIN", &fake_operator)
            .env("LOCAL_CLUSTER_NODES", nodes.to_string())
            .stdin(Stdio::null())
            .status()?;
        let mut c = Cluster {
            dir: dir.clone(),
            bin: PathBuf::new(),
            up: true,
        };
        if !st.success() {
            bail!("local-cluster.sh up failed");
        }
        eprintln!(
            "cluster up in {:.1} s: {}",
            t0.elapsed().as_secs_f64(),
            dir.display()
        );
        let env = std::fs::read_to_string(dir.join("env"))?;
        let path_line = env
            .lines()
            .find(|l| l.starts_with("export PATH="))
            .context("no PATH in env")?;
        let bin = path_line
            .trim_start_matches("export PATH=")
            .split(':')
            .next()
            .unwrap_or_default();
        c.bin = PathBuf::from(bin);
        Ok(c)
    }

    pub fn down(&mut self) -> bool {
        if !self.up {
            return true;
        }
        self.up = false;
        Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(&self.dir)
            .stdin(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    }

    pub fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut child = Command::new(self.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(self.dir.join("kubeconfig"))
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn apply(&self, ns: &str, yaml: &str) -> Result<()> {
        self.kubectl(&["-n", ns, "apply", "-f", "-"], Some(yaml))
            .map(|_| ())
    }

    pub fn get(&self, ns: &str, what: &str, jsonpath: &str) -> String {
        self.kubectl(
            &["-n", ns, "get", what, "-o", &format!("jsonpath={jsonpath}")],
            None,
        )
        .unwrap_or_default()
    }

    pub fn namespace(&self, ns: &str) -> Result<()> {
        self.kubectl(&["create", "namespace", ns], None).map(|_| ())
    }

    pub fn wait_ready(&self, ns: &str, pod: &str, timeout: Duration) -> Result<String> {
        let ok = wait(timeout, || {
            self.get(
                ns,
                &format!("pod/{pod}"),
                "{.status.conditions[?(@.type==\"Ready\")].status}",
            ) == "True"
        });
        if !ok {
            bail!(
                "pod {ns}/{pod} not Ready within {timeout:?}: {}",
                self.get(ns, &format!("pod/{pod}"), "{.status}")
            );
        }
        Ok(self.get(ns, &format!("pod/{pod}"), "{.status.podIP}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.down();
    }
}

pub fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    false
}

/// What of a cluster's node network exists on the machine: its bridge, the netns and veths of
/// its pod addresses (other clusters may run beside it), the processes in those netns.
pub struct Footprint {
    bridge: String,
    netns: Vec<String>,
    veths: Vec<String>,
    pids: Vec<i32>,
}

pub fn footprint(dir: &Path) -> Footprint {
    let net = std::fs::read_to_string(dir.join("network")).unwrap_or_default();
    let val = |k: &str| {
        net.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    let bridge = val("BRIDGE");
    let base: u32 = val("POD_CIDR")
        .split('.')
        .nth(2)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let ours = |name: &str, prefix: &str| {
        name.strip_prefix(prefix)
            .and_then(|r| r.split_once('-'))
            .and_then(|(c, _)| c.parse::<u32>().ok())
            .is_some_and(|c| (base..base + 32).contains(&c))
    };
    let out = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
            .unwrap_or_default()
    };
    let netns: Vec<String> = out(&["netns", "list"])
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| ours(n, "lk-"))
        .map(String::from)
        .collect();
    let veths: Vec<String> = out(&["-o", "link"])
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or_default().to_string())
        .filter(|n| ours(n, "lkv"))
        .collect();
    let pids = netns
        .iter()
        .flat_map(|n| {
            out(&["netns", "pids", n])
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    Footprint {
        bridge,
        netns,
        veths,
        pids,
    }
}

pub fn machine_is_clean(dir: &Path, before: &Footprint) -> Result<()> {
    assert!(!before.netns.is_empty(), "no pod netns seen before down");
    let after = footprint(dir);
    assert!(after.netns.is_empty(), "netns left: {:?}", after.netns);
    assert!(after.veths.is_empty(), "veths left: {:?}", after.veths);
    let links = String::from_utf8_lossy(&Command::new("ip").args(["-o", "link"]).output()?.stdout)
        .to_string();
    assert!(
        !before.bridge.is_empty() && !links.contains(&format!(": {}:", before.bridge)),
        "bridge {} left",
        before.bridge
    );
    // no address of the node network (the gateway, the nodes' own addresses) on any link
    let net = std::fs::read_to_string(dir.join("network")).unwrap_or_default();
    let third: Option<u32> = net
        .lines()
        .find_map(|l| l.strip_prefix("POD_CIDR="))
        .and_then(|c| c.split('.').nth(2))
        .and_then(|c| c.parse().ok());
    let addrs = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-4", "-o", "addr"])
            .output()?
            .stdout,
    )
    .to_string();
    if let Some(base) = third {
        for l in addrs.lines() {
            let Some(a) = l.split_whitespace().skip_while(|w| *w != "inet").nth(1) else {
                continue;
            };
            let o: Vec<u32> = a.split(['.', '/']).filter_map(|x| x.parse().ok()).collect();
            assert!(
                !(o.len() >= 3 && o[0] == 198 && o[1] == 18 && (base..base + 32).contains(&o[2])),
                "address of the node network left: {l}"
            );
        }
    }
    // the processes DIR/pids names (agents, the network process, the control plane)
    for e in std::fs::read_dir(dir.join("pids"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let pid = std::fs::read_to_string(e.path()).unwrap_or_default();
        let alive = pid.trim().parse::<u32>().is_ok_and(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .is_ok_and(|s| !s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
        });
        assert!(
            !alive,
            "{} (pid {}) still runs",
            e.path().display(),
            pid.trim()
        );
    }
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    let d = dir.to_string_lossy().to_string();
    for l in mounts.lines() {
        assert!(!l.contains(&d), "mount left: {l}");
        for n in &before.netns {
            assert!(!l.contains(&format!("/run/netns/{n} ")), "mount left: {l}");
        }
    }
    for e in std::fs::read_dir("/run")?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("local-cluster.owner") {
            let owner = std::fs::read_to_string(e.path()).unwrap_or_default();
            assert!(!owner.contains(&d), "{name} still names {d}");
        }
    }
    // a process killed at the agent's stop may take a moment to go, and one whose parent has
    // exited is a zombie until the machine's init reaps it: neither holds anything
    let gone = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('Z'))
            })
            .unwrap_or(true)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !before.pids.iter().all(gone) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for pid in &before.pids {
        let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            gone(pid),
            "pod process {pid} left: {}",
            cmd.replace('\0', " ")
        );
    }
    for e in std::fs::read_dir("/proc")?.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.parse::<u32>().is_err() {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        assert!(!cmd.contains(&d), "process {name} left: {cmd}");
    }
    Ok(())
}

/// Stands in for the operator binary: shows its args, user and what the in-cluster
/// configuration gives it (the API server through KUBERNETES_SERVICE_HOST with the pod's token).
const FAKE_OPERATOR: &str = r#"#!/bin/sh
echo "args: $*"
echo "uid: $(id -u)"
SA=/var/run/secrets/kubernetes.io/serviceaccount
curl -sS --cacert $SA/ca.crt -H "Authorization: Bearer $(cat $SA/token)" \
  "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api/v1/namespaces/$(cat $SA/namespace)/pods"
echo
exec sleep 3600
"#;

pub type Scenario = (&'static str, fn(&Cluster) -> Result<()>);

/// Runs the scenarios whose names hold one of the command line's arguments (all without one) on
/// one cluster of `nodes` nodes, then `down` and the clean-machine check; exits 1 on a failure.
pub fn run(scenarios: Vec<Scenario>, nodes: u32) {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("these tests need root (network namespaces, a bridge, mounts)");
        std::process::exit(1);
    }
    let selected: Vec<&Scenario> = scenarios
        .iter()
        .filter(|(n, _)| filter.is_empty() || filter.iter().any(|f| n.contains(f.as_str())))
        .collect();
    let mut failed = Vec::new();
    let mut cluster = match Cluster::start(nodes) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cannot start the cluster: {e:#}");
            std::process::exit(1);
        }
    };
    let dir = cluster.dir.clone();
    println!("running {} scenarios", selected.len() + 1);
    for (name, f) in &selected {
        let t0 = Instant::now();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&cluster)));
        let secs = t0.elapsed().as_secs_f64();
        match r {
            Ok(Ok(())) => println!("test {name} ... ok ({secs:.1} s)"),
            Ok(Err(e)) => {
                println!("test {name} ... FAILED ({secs:.1} s): {e:#}");
                failed.push(name.to_string());
            }
            Err(_) => {
                println!("test {name} ... FAILED ({secs:.1} s): panicked");
                failed.push(name.to_string());
            }
        }
    }
    let before = footprint(&dir);
    let down_ok = cluster.down();
    drop(cluster);
    let clean = std::panic::catch_unwind(|| machine_is_clean(&dir, &before))
        .unwrap_or_else(|_| Err(anyhow::anyhow!("panicked")));
    match clean {
        Ok(()) if down_ok => println!("test machine_clean_after_down ... ok"),
        Ok(()) => {
            println!("test machine_clean_after_down ... FAILED: down failed");
            failed.push("machine_clean_after_down".into());
        }
        Err(e) => {
            println!("test machine_clean_after_down ... FAILED: {e:#}");
            failed.push("machine_clean_after_down".into());
        }
    }
    if failed.is_empty() {
        let _ = std::fs::remove_dir_all(&dir);
        println!("test result: ok. {} passed", selected.len() + 1);
    } else {
        println!(
            "test result: FAILED. failed: {} (logs kept in {})",
            failed.join(", "),
            dir.display()
        );
        std::process::exit(1);
    }
}
