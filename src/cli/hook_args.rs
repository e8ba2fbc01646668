//! The command lines a hook run uses, read without clap: no arguments (how
//! nfd-worker runs a `source.d` hook), `features`, and `features` with
//! `--sysfs-root`. Building clap's tables for the whole command and parsing
//! took about 0.2 ms of a cold process, a fifth of a pass on an 8-GPU node
//! (docs/benchmarks.md); every other command line, and any of these that
//! is not exactly one of the forms below, goes to clap. A test holds the
//! two to the same answer for every form, so a flag or default added to
//! `Cli` that this does not know fails it.

use super::output::OutputArg;
use super::{Cli, Command, StateArgs};
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

/// The `Cli` clap would give for `args` (the arguments after the program's
/// name) with `env_root` as `NODEFABRIC_SYSFS_ROOT`, when `args` is one of
/// the hook's forms; `None` for clap to read. With no arguments at all and
/// no variable, the tree is [`crate::hook::bare_sysfs_root`], as clap's
/// path gives it (see `bare`).
pub(super) fn parse(args: &[OsString], env_root: Option<OsString>) -> Option<Cli> {
    // A variable set but empty, or a value clap might read as a flag, is
    // left to clap and its own words.
    let usable = |v: &OsStr| !v.is_empty() && !v.as_encoded_bytes().starts_with(b"-");
    if env_root.as_deref().is_some_and(|v| !usable(v)) {
        return None;
    }
    let flag_root = match args {
        [] => {
            let root = env_root.map_or_else(crate::hook::bare_sysfs_root, PathBuf::from);
            return Some(features(root));
        }
        [cmd] if cmd == "features" => None,
        [cmd, flag, value] | [flag, value, cmd] if cmd == "features" && flag == "--sysfs-root" => {
            Some(value.clone())
        }
        [cmd, flag] | [flag, cmd] if cmd == "features" => {
            Some(flag.to_str()?.strip_prefix("--sysfs-root=")?.into())
        }
        _ => return None,
    };
    if flag_root.as_deref().is_some_and(|v| !usable(v)) {
        return None;
    }
    let root = flag_root
        .or(env_root)
        .map_or_else(|| PathBuf::from("/sys"), PathBuf::from);
    Some(features(root))
}

/// `features` on `root`, every other flag at its default.
fn features(root: PathBuf) -> Cli {
    Cli {
        sysfs_root: root,
        replay_max_entries: crate::capture::limits::DEFAULT_MAX_ENTRIES,
        replay_max_bytes: crate::capture::limits::parse_max_bytes(super::DEFAULT_REPLAY_MAX_BYTES)
            .expect("the default replay size parses"),
        label_namespace: super::parse_namespace(crate::labels::DEFAULT_NAMESPACE)
            .expect("the default namespace is valid"),
        nvidia_smi: None,
        nvml_lib: None,
        nvidia_smi_q: None,
        ascend_fabric: None,
        tool_timeout: super::parse_tool_timeout(super::DEFAULT_TOOL_TIMEOUT)
            .expect("the default tool timeout parses"),
        log_level: super::DEFAULT_LOG_LEVEL
            .parse()
            .expect("the default log level parses"),
        command: Command::Features(StateArgs {
            state_dir: None,
            output: OutputArg { output: None },
        }),
        replayed_answers: None,
        replayed_rails: None,
        full: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, FromArgMatches};

    /// What clap gives for `args` with the tree variable at `env`, read
    /// through a variable of this test's own (the process's environment is
    /// shared with every other test thread), or its error.
    fn by_clap(args: &[&str], env: Option<&str>, var: &'static str) -> Result<String, String> {
        match env {
            // SAFETY (edition 2021: safe to call): the variable's name is
            // this test's alone, and std serialises its own env access.
            Some(v) => std::env::set_var(var, v),
            None => std::env::remove_var(var),
        }
        let cmd = Cli::command().mut_arg("sysfs_root", |a| a.env(var));
        let argv = std::iter::once("nodefabric").chain(args.iter().copied());
        let m = cmd.try_get_matches_from(argv).map_err(|e| e.to_string())?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| e.to_string())?;
        Ok(format!("{cli:?}"))
    }

    /// Every form the fast path takes gives what clap gives, and every form
    /// it leaves is one it must leave (a typo, a second flag, a value clap
    /// reads its own way).
    #[test]
    fn the_hooks_command_lines_read_without_clap_equal_claps_reading() {
        let taken: &[&[&str]] = &[
            &["features"],
            &["features", "--sysfs-root", "/host/sys"],
            &["--sysfs-root", "/host/sys", "features"],
            &["features", "--sysfs-root=/tmp/tree"],
            &["--sysfs-root=/tmp/tree", "features"],
        ];
        let cases = [
            (None, "NODEFABRIC_TEST_HOOK_ARGS_UNSET"),
            (Some("/from/env"), "NODEFABRIC_TEST_HOOK_ARGS_SET"),
        ];
        for (env, var) in cases {
            for args in taken {
                let os: Vec<OsString> = args.iter().map(OsString::from).collect();
                let fast = parse(&os, env.map(OsString::from))
                    .unwrap_or_else(|| panic!("{args:?} with {env:?}: left to clap"));
                assert_eq!(
                    Ok(format!("{fast:?}")),
                    by_clap(args, env, var),
                    "{args:?} with {env:?}"
                );
            }
        }
        let left: &[&[&str]] = &[
            &["features", "--sysfs-root"],
            &["features", "--sysfs-root", ""],
            &["features", "--sysfs-root", "-x"],
            &["features", "--sysfs-root=", "x"],
            &["features", "-o", "json"],
            &["feature"],
            &["features", "--sysfs-root", "/a", "--sysfs-root", "/b"],
            &["inventory"],
            &["--help"],
            &["features", "--version"],
        ];
        for args in left {
            let os: Vec<OsString> = args.iter().map(OsString::from).collect();
            assert!(parse(&os, None).is_none(), "{args:?} was not left to clap");
        }
        // A variable clap reads its own way is left to it too.
        assert!(parse(&[OsString::from("features")], Some(OsString::new())).is_none());
        assert!(parse(&[], Some(OsString::from("-x"))).is_none());
    }

    /// No arguments and no variable: the hook's own tree, as `bare` gives.
    #[test]
    fn no_arguments_read_the_hooks_tree() {
        let cli = parse(&[], None).expect("taken");
        assert_eq!(cli.sysfs_root, crate::hook::bare_sysfs_root());
        assert!(matches!(cli.command, Command::Features(_)));
        let cli = parse(&[], Some("/t".into())).expect("taken");
        assert_eq!(cli.sysfs_root, PathBuf::from("/t"));
    }
}
