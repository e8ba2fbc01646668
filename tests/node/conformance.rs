//! docs/conformance.md is true to the code and to upstream: each row's
//! "Ours" equals its "Upstream" unless the row says why it differs, and the
//! rows that name a constant of ours show the value the code holds.

use crate::support::dra::KUBELET_DRA_DEADLINE;
use nodefabric::dra::api::{health_v1alpha1, v1, v1beta1};
use nodefabric::dra::{attributes, devices, registration, slices};
use nodefabric::kubelet::registration_api::registration_server;
use nodefabric::plugin::api as dp;
use std::collections::BTreeMap;

/// One row of a table: our value, upstream's, and where upstream says so.
struct Row {
    ours: String,
    upstream: String,
    source: String,
}

/// Every table row of docs/conformance.md, by its first cell.
fn rows() -> BTreeMap<String, Row> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/conformance.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells.len(), 4, "a row of four cells: {line}");
        if cells[0] == "Constant" {
            continue;
        }
        let row = Row {
            ours: cells[1].trim_matches('`').to_string(),
            upstream: cells[2].trim_matches('`').to_string(),
            source: cells[3].to_string(),
        };
        assert!(
            out.insert(cells[0].to_string(), row).is_none(),
            "{} is listed twice",
            cells[0]
        );
    }
    out
}

#[test]
fn every_row_is_upstreams_value_unless_it_says_why_not() {
    let rows = rows();
    assert!(rows.len() > 30, "{}", rows.len());
    for (name, row) in &rows {
        if row.ours != row.upstream {
            assert!(
                row.source.contains("Differs:"),
                "{name}: ours {:?}, upstream {:?}, and no reason",
                row.ours,
                row.upstream
            );
        }
        assert!(!row.source.is_empty(), "{name} names no source");
    }
}

#[test]
fn the_rows_that_name_our_constants_show_what_the_code_holds() {
    let rows = rows();
    let method = |service: &str, method: &str| format!("/{service}/{method}");
    let code: Vec<(&str, String)> = vec![
        (
            "DRA v1 prepare path",
            method(v1::dra_plugin_server::SERVICE_NAME, "NodePrepareResources"),
        ),
        (
            "DRA v1 unprepare path",
            method(
                v1::dra_plugin_server::SERVICE_NAME,
                "NodeUnprepareResources",
            ),
        ),
        (
            "DRA v1beta1 prepare path",
            method(
                v1beta1::dra_plugin_server::SERVICE_NAME,
                "NodePrepareResources",
            ),
        ),
        (
            "DRA v1beta1 unprepare path",
            method(
                v1beta1::dra_plugin_server::SERVICE_NAME,
                "NodeUnprepareResources",
            ),
        ),
        (
            "DRA health stream path",
            method(
                health_v1alpha1::dra_resource_health_server::SERVICE_NAME,
                "NodeWatchResources",
            ),
        ),
        (
            "GetInfo path",
            method(registration_server::SERVICE_NAME, "GetInfo"),
        ),
        (
            "NotifyRegistrationStatus path",
            method(
                registration_server::SERVICE_NAME,
                "NotifyRegistrationStatus",
            ),
        ),
        (
            "Device-plugin Register path",
            method(dp::registration_server::SERVICE_NAME, "Register"),
        ),
        (
            "Device-plugin service",
            dp::device_plugin_server::SERVICE_NAME.to_string(),
        ),
        ("DRA plugin type", registration::PLUGIN_TYPE.to_string()),
        ("DRA supported versions", registration::VERSIONS.join(", ")),
        (
            "Registration folder",
            registration::REGISTRY_DIR.to_string(),
        ),
        (
            "Registration socket suffix",
            registration::REGISTRATION_SOCKET_SUFFIX.to_string(),
        ),
        ("Plugins folder", registration::PLUGINS_DIR.to_string()),
        (
            "DRA service socket",
            registration::SERVICE_SOCKET.to_string(),
        ),
        (
            "Prepare/Unprepare deadline",
            format!("{} s", KUBELET_DRA_DEADLINE.as_secs()),
        ),
        (
            "Device-plugin API version",
            nodefabric::plugin::server::API_VERSION.to_string(),
        ),
        (
            "kubelet socket",
            nodefabric::plugin::server::KUBELET_SOCKET.to_string(),
        ),
        ("Healthy", nodefabric::plugin::catalog::HEALTHY.to_string()),
        (
            "Unhealthy",
            nodefabric::plugin::catalog::UNHEALTHY.to_string(),
        ),
        (
            "CDI annotation prefix",
            nodefabric::plugin::allocate::CDI_ANNOTATION_PREFIX.to_string(),
        ),
        ("CDI spec version", nodefabric::cdi::CDI_VERSION.to_string()),
        (
            "Standard attribute domain",
            attributes::STANDARD_DOMAIN.to_string(),
        ),
        ("PCIe root attribute", attributes::PCIE_ROOT.to_string()),
        ("PCI bus ID attribute", attributes::PCI_BUS_ID.to_string()),
        ("NUMA node attribute", attributes::NUMA_NODE.to_string()),
        (
            "DeviceClass extended resource field",
            extended_resource_field(),
        ),
        (
            "Devices per slice",
            slices::MAX_DEVICES_PER_SLICE.to_string(),
        ),
        (
            "Attributes and capacities per device",
            devices::MAX_ATTRIBUTES.to_string(),
        ),
        ("Attribute string length", devices::MAX_STRING.to_string()),
        (
            "Devices per slice with taints",
            nodefabric::dra::taints::DEVICES_PER_SLICE.to_string(),
        ),
        (
            "Driver name length",
            nodefabric::names::DRIVER_NAME_MAX.to_string(),
        ),
    ];
    for (name, value) in code {
        let row = rows
            .get(name)
            .unwrap_or_else(|| panic!("docs/conformance.md has no row {name:?}"));
        assert_eq!(row.ours, value, "docs/conformance.md row {name:?}");
    }
}

/// The JSON key the typed DeviceClassSpec writes its extended resource
/// name under: what the API server reads, whatever the Rust field is called.
fn extended_resource_field() -> String {
    let spec = k8s_openapi::api::resource::v1::DeviceClassSpec {
        extended_resource_name: Some("example.com/x".into()),
        ..Default::default()
    };
    let value = serde_json::to_value(spec).unwrap();
    let keys: Vec<&String> = value.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 1, "{value}");
    keys[0].clone()
}

#[test]
fn the_standard_attributes_are_each_a_row_and_in_the_standard_domain() {
    let rows = rows();
    for name in attributes::STANDARD {
        assert!(
            rows.values().any(|r| r.ours == name),
            "docs/conformance.md has no row for {name}"
        );
        assert!(name.starts_with(&format!("{}/", attributes::STANDARD_DOMAIN)));
    }
}

/// cdi's `validateVendorOrClassName` (pkg/parser/parser.go:146-167): a
/// letter first, a letter or digit last, letters, digits, `_ . -` between.
fn cdi_vendor_or_class(name: &str) -> bool {
    let inner = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    name.len() >= 2
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(inner)
}

#[test]
fn every_cdi_kind_we_write_is_one_the_runtimes_parser_takes() {
    let kinds = [
        nodefabric::cdi::Family::Whole.kind(),
        nodefabric::cdi::Family::Partitioned.kind(),
        nodefabric::dra::claim_spec::KIND,
    ];
    for kind in kinds {
        let (vendor, class) = kind.split_once('/').unwrap();
        assert!(cdi_vendor_or_class(vendor), "{kind}: vendor {vendor:?}");
        assert!(cdi_vendor_or_class(class), "{kind}: class {class:?}");
        assert!(
            rows()["CDI kind rule"]
                .source
                .contains(&format!("`{kind}`")),
            "docs/conformance.md's kind row does not list {kind}"
        );
    }
    // The rule itself refuses what the parser refuses.
    for bad in ["1vendor", "vendor-", "ven dor", "v", ""] {
        assert!(!cdi_vendor_or_class(bad), "{bad:?}");
    }
}
