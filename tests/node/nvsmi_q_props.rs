//! Property tests of the `nvidia-smi -q` readers (text and `-q -x` XML): a
//! damaged answer never panics, and an answer the parser accepts always
//! holds as many GPU sections as it announces, so a dump cut short can never
//! read as "these GPUs have no fabric".

use crate::support::fixtures;
use nodefabric::fabric::nvidia::parse_any;
use proptest::prelude::*;

const UUID: &str = "5b0e1122-3344-5566-7788-99aabbccddef";

fn text() -> String {
    fixtures::nvsmi_q(|_| ("Completed", "Success", "1", UUID))
}

fn xml() -> String {
    let mut s = String::from(
        "<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<attached_gpus>2</attached_gpus>\n",
    );
    for bus in ["12", "22"] {
        s.push_str(&format!(
            "<gpu id=\"00000000:{bus}:00.0\">\n<fabric>\n<state>Completed</state>\n<status>Success</status>\n<cliqueId>1</cliqueId>\n<clusterUuid>{UUID}</clusterUuid>\n</fabric>\n</gpu>\n"
        ));
    }
    s.push_str("</nvidia_smi_log>\n");
    s
}

/// The GPU count an answer announces, read the way a person would.
fn announced(answer: &str) -> Option<usize> {
    if let Some(i) = answer.find("<attached_gpus>") {
        let rest = &answer[i + "<attached_gpus>".len()..];
        return rest[..rest.find('<')?].trim().parse().ok();
    }
    let line = answer
        .lines()
        .find(|l| l.trim_start().starts_with("Attached GPUs"))?;
    line.split_once(':')?.1.trim().parse().ok()
}

proptest! {
    // Failures are kept beside this file: proptest's default looks for the
    // folder above the nearest main.rs (tests/proptest-regressions/).
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: Some(Box::new(
            prop::test_runner::FileFailurePersistence::WithSource("proptest-regressions"),
        )),
        ..ProptestConfig::default()
    })]

    /// Cutting either form anywhere is refused or (when the cut only lost
    /// trailing text) read whole: never a partial set of GPUs.
    #[test]
    fn a_cut_answer_is_never_read_as_fewer_gpus(xml_form in any::<bool>(), cut in 0.0f64..1.0) {
        let full = if xml_form { xml() } else { text() };
        let mut at = (full.len() as f64 * cut) as usize;
        while !full.is_char_boundary(at) { at -= 1; }
        let part = &full[..at];
        if let Ok(map) = parse_any(part) {
            let expected = parse_any(&full).unwrap();
            prop_assert_eq!(map.len(), expected.len(), "a cut answer read as a different set of GPUs");
        }
    }

    /// Random bytes spliced into either form never panic the parser, and an
    /// accepted answer never holds more fabric blocks than it announces GPUs.
    #[test]
    fn mutated_answers_never_panic(xml_form in any::<bool>(), at in 0.0f64..1.0, junk in "[ -~\\t\\n<>:/]{0,40}") {
        let full = if xml_form { xml() } else { text() };
        let mut i = (full.len() as f64 * at) as usize;
        while !full.is_char_boundary(i) { i -= 1; }
        let mutated = format!("{}{}{}", &full[..i], junk, &full[i..]);
        if let Ok(map) = parse_any(&mutated) {
            if let Some(n) = announced(&mutated) {
                prop_assert!(map.len() <= n, "{} blocks for {} announced GPUs", map.len(), n);
            }
        }
    }

    /// Arbitrary text never panics.
    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,400}") {
        let _ = parse_any(&s);
    }
}
