//! Runs the whole job of `nodefabric` with no host requirements, on the
//! bundled 8-GPU / 8-NIC fixture sysfs tree and the vendor answers saved
//! beside this file (examples/demo/: `nvidia-smi -q`, `topo -m`,
//! `--query-gpu`, and a rail rule that names rails by port): the preflight
//! table, the labels, the rail map, the topo matrix, what each CDI spec
//! holds, the tokens the device plugin would advertise and the devices the
//! DRA driver would publish, each computed by the project's own code; then
//! where every file was written (under `target/demo/`).
//!
//! ```text
//! cargo run --example demo            # then: cat target/demo/features.d/nodefabric
//! ```

#[path = "../tests/support/fixtures.rs"]
mod fixtures;

use clap::Parser;
use nodefabric::cdi::{Family, Spec};
use nodefabric::cli::{self, Cli};
use nodefabric::dra::devices::{self, Attribute, Published};
use nodefabric::plugin::catalog::{self, Catalog, Resource};
use nodefabric::rails::RailRecord;
use nodefabric::table::Table;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The resource-name prefix the device plugin serves under by default.
const RESOURCE_PREFIX: &str = "device.gpustack.ai";

fn main() -> ExitCode {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let answers = here.join("examples/demo");
    let out = here.join("target/demo");
    let sysfs = out.join("sysfs");
    let _ = std::fs::remove_dir_all(&out);
    fixtures::gpu8_switch_paired(&sysfs);
    println!("fixture sysfs tree: {}", sysfs.display());
    println!("vendor answers: {}\n", answers.display());
    let path = |p: &Path| p.to_str().expect("UTF-8 path").to_string();
    let root = path(&sysfs);
    let nvsmi_q = path(&answers.join("nvidia-smi-q.txt"));
    // The rail inputs: a rail rule by port name (interface-name: the eight
    // GPU-paired NICs, mlx5_0..7, one rail each) and nvidia-smi's saved
    // answers for the GPU-to-NIC path classes.
    let rails_config = path(&answers.join("rails.yaml"));
    let topo = path(&answers.join("nvidia-smi-topo-m.txt"));
    let query = path(&answers.join("nvidia-smi-query-gpu.csv"));
    let rail_flags = [
        "--rails-config",
        &rails_config,
        "--topo-file",
        &topo,
        "--gpu-query-file",
        &query,
    ];
    let run = |args: &[&str]| {
        let mut argv = vec![
            "nodefabric",
            "--sysfs-root",
            &root,
            "--nvidia-smi-q",
            &nvsmi_q,
        ];
        argv.extend_from_slice(args);
        println!("$ {}", shown(&argv, here));
        let code = cli::run(&Cli::parse_from(argv));
        println!();
        code
    };

    heading("Preflight: every RDMA endpoint, the accelerators and the labels");
    run(&["preflight"]);

    heading("Publish: the feature file, the CDI specs, the record and the rail record");
    let features = out.join("features.d");
    let state = out.join("state");
    let cdi = out.join("cdi");
    let rails_file = out.join("rails.json");
    let mut publish = vec![
        "publish".to_string(),
        "--features-dir".into(),
        path(&features),
        "--state-dir".into(),
        path(&state),
        "--cdi-dir".into(),
        path(&cdi),
        "--rails-file".into(),
        path(&rails_file),
    ];
    publish.extend(rail_flags.iter().map(|s| s.to_string()));
    let code = run(&publish.iter().map(String::as_str).collect::<Vec<_>>());
    if code != ExitCode::SUCCESS {
        return code;
    }

    heading("Rails: for each GPU and rail, the closest NICs and their path class");
    let mut rails = vec!["rails"];
    rails.extend_from_slice(&rail_flags);
    run(&rails);

    heading("Topo: each accelerator's path class to each RDMA NIC, by the labels' own walk");
    run(&["topo", "--rails-file", &path(&rails_file)]);

    let published = match read_specs(&cdi) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    heading("CDI specs: what a container runtime injects for each device");
    print!("{}", cdi_summary(&published, here));

    heading("Device plugin: the tokens kubelet would be offered, per resource");
    print!("{}", tokens(&published));

    heading("DRA: the devices of this node's ResourceSlices, and their attributes");
    let record: Option<RailRecord> = std::fs::read(&rails_file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok());
    print!("{}", dra(&published, record.as_ref()));

    heading("Files written");
    for f in [
        features.join("nodefabric"),
        cdi.join(Family::Whole.file_name()),
        cdi.join(Family::Partitioned.file_name()),
        state.join("record.json"),
        rails_file,
    ] {
        if f.exists() {
            println!("  {}", f.display());
        }
    }
    ExitCode::SUCCESS
}

fn heading(title: &str) {
    println!("== {title}\n");
}

/// The command line as typed from the repository root.
fn shown(argv: &[&str], here: &Path) -> String {
    let prefix = format!("{}/", here.display());
    argv.iter()
        .map(|a| a.replace(&prefix, ""))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The specs `publish` wrote, as the plugins read them.
fn read_specs(dir: &Path) -> Result<Published, String> {
    let mut out = Published::new();
    for family in Family::ALL {
        let file: PathBuf = dir.join(family.file_name());
        let Ok(bytes) = std::fs::read(&file) else {
            continue; // a family with no device has no file
        };
        let spec: Spec = serde_json::from_slice(&bytes)
            .map_err(|e| format!("{}: not a CDI spec: {e}", file.display()))?;
        out.insert(family, (file, spec));
    }
    Ok(out)
}

/// One row per CDI device: its ID, its endpoint's place and what it injects.
fn cdi_summary(published: &Published, here: &Path) -> String {
    let mut s = String::new();
    for (file, spec) in published.values() {
        let shown = file.strip_prefix(here).unwrap_or(file);
        s.push_str(&format!(
            "{} (cdiVersion {}, kind {}, {} devices)\n",
            shown.display(),
            spec.cdi_version,
            spec.kind,
            spec.devices.len()
        ));
        let mut t = Table::new(&["CDI DEVICE", "PCI", "NUMA", "LINK", "NETDEV", "INJECTS"]);
        for d in &spec.devices {
            let a = d.endpoint(&spec.kind, file).ok();
            let nodes: Vec<&str> = d
                .container_edits
                .device_nodes
                .iter()
                .map(|n| n.path.as_str())
                .collect();
            t.row(vec![
                format!("{}={}", spec.kind, d.name),
                a.as_ref()
                    .and_then(|a| a.pci_address.clone())
                    .unwrap_or_else(|| "-".into()),
                a.as_ref()
                    .and_then(|a| a.numa)
                    .map_or_else(|| "-".into(), |n| n.to_string()),
                a.as_ref()
                    .map_or_else(|| "-".into(), |a| a.link.as_str().into()),
                a.as_ref()
                    .map(|a| a.interfaces.join(","))
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "-".into()),
                nodes.join(" "),
            ]);
        }
        s.push_str(&t.render());
        s.push('\n');
    }
    s
}

/// The plugin's catalog of these specs and each resource's tokens.
fn tokens(published: &Published) -> String {
    let mut c = Catalog::default();
    for (family, (file, spec)) in published {
        c = c.with_family(*family, catalog::endpoints_of(spec, file));
    }
    let mut t = Table::new(&["RESOURCE", "TOKENS", "HEALTHY", "IDS"]);
    for r in Resource::ALL {
        let tokens = c.tokens(r);
        let healthy = tokens.iter().filter(|t| t.endpoint.healthy).count();
        let ids: Vec<&str> = tokens.iter().map(|t| t.id.as_str()).collect();
        // 64 shared tokens per NIC: the first and last say the pattern.
        let shown = match ids.len() {
            0 => "-".to_string(),
            n if n > 12 => format!("{} … {}", ids[..3].join(" "), ids[n - 1]),
            _ => ids.join(" "),
        };
        t.row(vec![
            format!("{RESOURCE_PREFIX}/{}", r.suffix()),
            tokens.len().to_string(),
            healthy.to_string(),
            shown,
        ]);
    }
    t.render() + "\n"
}

/// The DRA driver's pool of these specs and the rail record.
fn dra(published: &Published, rails: Option<&RailRecord>) -> String {
    let pool = devices::pool(published, rails);
    let mut t = Table::new(&["DEVICE", "CDI ID", "ATTRIBUTES"]);
    for d in &pool.devices {
        let attrs: Vec<String> = d
            .attributes
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Attribute::Bool(b) => b.to_string(),
                    Attribute::Int(i) => i.to_string(),
                    Attribute::String(s) => s.clone(),
                };
                format!("{k}={v}")
            })
            .collect();
        t.row(vec![d.name.clone(), d.cdi_id.clone(), attrs.join(" ")]);
    }
    let mut s = t.render();
    for r in &pool.refused {
        s.push_str(&format!("left out: {r}\n"));
    }
    s + "\n"
}
