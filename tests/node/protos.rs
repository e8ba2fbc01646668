//! The vendored protocol files are upstream's, byte for byte: every `.proto`
//! under `proto/` has a line in `proto/NOTICE` naming its repository, tag,
//! commit, license and the SHA-256 of upstream's file, and hashes to it.
//! A hand edit (the fault that once renamed kubelet's DRA package to a bare
//! `v1`, so a real kubelet's every Prepare answered UNIMPLEMENTED) fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One NOTICE line: where a vendored file comes from.
#[derive(Debug)]
struct Source {
    repository: String,
    tag: String,
    commit: String,
    sha256: String,
    license: String,
}

fn proto_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proto")
}

/// The NOTICE's file lines, by path under `proto/`.
fn notice() -> BTreeMap<String, Source> {
    let text = std::fs::read_to_string(proto_dir().join("NOTICE")).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.matches(" | ").count() == 5) {
        let f: Vec<&str> = line.split(" | ").map(str::trim).collect();
        if f[0] == "One line per file: path" {
            continue;
        }
        let source = Source {
            repository: f[1].into(),
            tag: f[2].into(),
            commit: f[3].into(),
            sha256: f[4].into(),
            license: f[5].into(),
        };
        assert!(
            out.insert(f[0].to_string(), source).is_none(),
            "{} is named twice in proto/NOTICE",
            f[0]
        );
    }
    out
}

/// Every `.proto` under `proto/`, as paths relative to it.
fn vendored(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            vendored(&path, out);
        } else if path.extension().is_some_and(|e| e == "proto") {
            let rel = path.strip_prefix(proto_dir()).unwrap();
            out.push(rel.to_string_lossy().into_owned());
        }
    }
}

#[test]
fn every_vendored_proto_hashes_to_the_upstream_digest_its_notice_line_names() {
    let notice = notice();
    let mut files = Vec::new();
    vendored(&proto_dir(), &mut files);
    files.sort();
    assert!(!files.is_empty());
    for file in &files {
        let source = notice
            .get(file)
            .unwrap_or_else(|| panic!("proto/{file} has no line in proto/NOTICE"));
        let bytes = std::fs::read(proto_dir().join(file)).unwrap();
        let digest = hex(ring::digest::digest(&ring::digest::SHA256, &bytes).as_ref());
        assert_eq!(
            digest, source.sha256,
            "proto/{file} differs from {} {} ({}): vendor upstream's file unchanged",
            source.repository, source.tag, source.commit
        );
        assert!(
            source.repository.starts_with("github.com/kubernetes/"),
            "{source:?}"
        );
        assert!(source.tag.starts_with('v'), "{source:?}");
        assert_eq!(source.commit.len(), 40, "{source:?}");
        assert!(source.commit.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(source.license, "Apache-2.0", "{source:?}");
        // The folder repeats the Go module path of the repository it names.
        let module = source
            .repository
            .trim_start_matches("github.com/kubernetes/");
        assert!(
            file.starts_with(&format!("k8s.io/{module}/")),
            "proto/{file} is not under k8s.io/{module}/"
        );
    }
    for named in notice.keys() {
        assert!(
            files.contains(named),
            "proto/NOTICE names {named}, which is not vendored"
        );
    }
}

#[test]
fn the_vendored_packages_are_the_ones_kubelet_calls() {
    // The `package` line names every gRPC path: kubelet calls DRA at
    // /k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/..., the device plugin at
    // /v1beta1.DevicePlugin/..., the registration socket at
    // /pluginregistration.Registration/...
    let expected = [
        (
            "k8s.io/kubelet/pkg/apis/dra/v1/api.proto",
            "k8s.io.kubelet.pkg.apis.dra.v1",
        ),
        (
            "k8s.io/kubelet/pkg/apis/dra/v1beta1/api.proto",
            "k8s.io.kubelet.pkg.apis.dra.v1beta1",
        ),
        (
            "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1/api.proto",
            "v1alpha1",
        ),
        (
            "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto",
            "v1beta1",
        ),
        (
            "k8s.io/kubelet/pkg/apis/pluginregistration/v1/api.proto",
            "pluginregistration",
        ),
        ("k8s.io/cri-api/pkg/apis/runtime/v1/api.proto", "runtime.v1"),
    ];
    for (file, package) in expected {
        let text = std::fs::read_to_string(proto_dir().join(file)).unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with("package "))
            .unwrap_or_else(|| panic!("proto/{file} has no package line"));
        let name = line
            .trim_start_matches("package ")
            .split(';')
            .next()
            .unwrap();
        assert_eq!(name, package, "proto/{file}");
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
