//! The host-lldp rail source against a real lldpd: two network namespaces
//! joined by veth pairs named like rail ports, Debian's `lldpd` running in
//! each, and `nodefabric rails --lldp-socket` reading the real `lldpctl -f json`
//! neighbour table. LLDP frames stay on the veth pairs inside those
//! namespaces; nothing is sent anywhere else.
//!
//! Needs root, `ip` (iproute2) and `lldpd` (scripts/test.sh installs them).
//! Without them the test is skipped with a message, except under CI, where
//! it fails.

use crate::support::{fixtures, host, wait};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// `None` when the test can run, or why it cannot.
fn missing() -> Option<String> {
    if !host::is_root() {
        return Some("not root".into());
    }
    let absent: Vec<&str> = ["ip", "lldpd", "lldpctl"]
        .into_iter()
        .filter(|c| !host::have(c))
        .collect();
    (!absent.is_empty()).then(|| format!("missing {}", absent.join(", ")))
}

fn sh(args: &[&str]) {
    let o = Command::new(args[0]).args(&args[1..]).output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Two namespaces, the "host" and the "switch", removed on drop with their
/// lldpd processes.
struct Lab {
    host: String,
    switch: String,
    daemons: Vec<Child>,
    dir: tempfile::TempDir,
}

impl Lab {
    fn new(ports: &[&str]) -> Lab {
        let id = std::process::id();
        let lab = Lab {
            host: format!("nf-host-{id}"),
            switch: format!("nf-sw-{id}"),
            daemons: vec![],
            dir: tempfile::tempdir().unwrap(),
        };
        sh(&["ip", "netns", "add", &lab.host]);
        sh(&["ip", "netns", "add", &lab.switch]);
        for (i, port) in ports.iter().enumerate() {
            let peer = format!("swp{i}");
            sh(&[
                "ip",
                "link",
                "add",
                port,
                "netns",
                &lab.host,
                "type",
                "veth",
                "peer",
                "name",
                &peer,
                "netns",
                &lab.switch,
            ]);
            sh(&["ip", "-n", &lab.host, "link", "set", port, "up"]);
            sh(&["ip", "-n", &lab.switch, "link", "set", &peer, "up"]);
        }
        lab
    }

    fn socket(&self, ns: &str) -> PathBuf {
        self.dir.path().join(format!("{ns}.sock"))
    }

    /// Starts lldpd in `ns`, transmitting every second.
    fn lldpd(&mut self, ns: &str) {
        // lldpd drops privileges into this chroot; Debian's package creates it at boot.
        std::fs::create_dir_all("/run/lldpd").unwrap();
        let conf = self.dir.path().join(format!("{ns}.conf"));
        std::fs::write(&conf, "configure lldp tx-interval 1\n").unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "lldpd", "-d", "-u"])
            .arg(self.socket(ns))
            .arg("-O")
            .arg(&conf)
            .args(["-S", &format!("nodefabric test {ns}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.daemons.push(child);
    }

    /// Polls lldpctl until every port has a neighbour.
    fn wait_for_neighbours(&self, ports: &[&str]) -> Value {
        wait::until(
            &format!("LLDP neighbours on {ports:?}"),
            || {
                let o = Command::new("lldpctl")
                    .arg("-u")
                    .arg(self.socket(&self.host))
                    .args(["-f", "json"])
                    .output()
                    .unwrap();
                o.status
                    .success()
                    .then(|| serde_json::from_slice::<Value>(&o.stdout).unwrap())
            },
            |v| {
                v.as_ref().is_some_and(|v| {
                    let seen = nodefabric::rails::lldp::interfaces(v).unwrap();
                    ports.iter().all(|p| seen.contains(*p))
                })
            },
        )
        .unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
            let _ = d.wait();
        }
        for ns in [&self.host, &self.switch] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn rails(root: &Path, socket: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nodefabric"))
        .args(["rails", "-o", "json", "--sysfs-paths", "--sysfs-root"])
        .arg(root)
        .arg("--lldp-socket")
        .arg(socket)
        .args([
            "--interface-regex",
            "^eth_r([0-9]+)_p[0-9]+$",
            "--rail-id",
            "rail$1",
        ])
        .output()
        .unwrap()
}

#[test]
fn real_lldpd_neighbours_become_rails() {
    if !host::runnable("the real LLDP test", missing()) {
        return;
    }
    // The "host" ports are named like the fixture's rail NICs (GPU i's NIC is
    // eth_r{i/2}_p{i%2}); one rail with both ports, one with a single port.
    let ports = ["eth_r0_p0", "eth_r0_p1", "eth_r2_p0"];
    let mut lab = Lab::new(&ports);
    let (host, switch) = (lab.host.clone(), lab.switch.clone());
    lab.lldpd(&host);
    lab.lldpd(&switch);
    let table = lab.wait_for_neighbours(&ports);
    // lldpctl prints several neighbours as a list of one-key objects.
    assert!(table["lldp"]["interface"].is_array(), "{table}");

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("sys");
    fixtures::gpu8_named(&root, |i, _| format!("eth_r{}_p{}", i / 2, i % 2));
    let o = rails(&root, &lab.socket(&host));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        r["nics"],
        json!({"0000:13:00.0": ["rail0"], "0000:23:00.0": ["rail0"], "0000:93:00.0": ["rail2"]}),
        "only ports with a neighbour, named by the template"
    );
    assert_eq!(
        r["gpus"][0]["rails"]["rail0"],
        json!({"nics": ["0000:13:00.0"], "pathClass": "PIX"})
    );
    assert_eq!(
        r["gpus"][1]["rails"]["rail0"],
        json!({"nics": ["0000:23:00.0"], "pathClass": "PIX"})
    );
    assert_eq!(
        r["gpus"][0]["rails"]["rail2"],
        json!({"nics": ["0000:93:00.0"], "pathClass": "SYS"})
    );

    // One neighbour left: lldpctl switches to the single-object shape, read the same way.
    let _ = Command::new("ip")
        .args(["-n", &host, "link", "del", "eth_r0_p1"])
        .status();
    let _ = Command::new("ip")
        .args(["-n", &host, "link", "del", "eth_r2_p0"])
        .status();
    let single = wait::until(
        "lldpctl to list one neighbour",
        || {
            let o = Command::new("lldpctl")
                .arg("-u")
                .arg(lab.socket(&host))
                .args(["-f", "json"])
                .output()
                .unwrap();
            serde_json::from_slice::<Value>(&o.stdout).unwrap()
        },
        |v| v["lldp"]["interface"].is_object(),
    );
    assert!(
        single["lldp"]["interface"].get("eth_r0_p0").is_some(),
        "{single}"
    );
    let o = rails(&root, &lab.socket(&host));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["nics"], json!({"0000:13:00.0": ["rail0"]}));
}
