//! `cargo bench --bench features -- --replay`: where `nodefabric features`
//! spends its time beyond its floor, split into the system calls it makes
//! and its own work. A C program replays, from an strace of nodefabric on
//! the same tree, exactly the calls it made under the tree (each `openat2`
//! with its flags and resolve mode, then the `read` of a file, the listing
//! of a folder or the `close` of an `O_PATH` handle; each `readlinkat`;
//! each `fstatat` of a folder it counts),
//! and nothing else; then the same without the `O_PATH` checks, and
//! without the folder listings too. Each is timed in rotating order with
//! nodefabric and the floor; the median of the per-run ratios to the floor
//! of the same round.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::{floor, installed, load, measured, quantile, report, run_once, strace};

/// The replayer, after `floor::compile`'s `read_list`. Its list: one call a line, `KIND FLAGS RESOLVE PATH`,
/// KIND `F` (open, read, close), `D` (open, list to the end, close), `P`
/// (open, close), `L` (readlinkat; flags unused), `S` (fstatat, not
/// following the last name; flags unused); the paths under the root
/// given second, opened as nodefabric opens them (beneath a handle on the
/// root). A failed open is made and fails as it did.
const SOURCE: &str = r#"
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    char *list = read_list(argv[1]);
    if (!list) return 1;
    int root = open(argv[2], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) return 1;
    static char buf[8192];
    for (char *line = list; *line;) {
        char *end = strchr(line, '\n');
        if (!end) return 1;
        *end = 0;
        char *p = line + 2;
        unsigned long long flags = strtoull(p, &p, 10);
        unsigned long long resolve = strtoull(p, &p, 10);
        char *path = p + 1;
        if (line[0] == 'L') {
            readlinkat(root, path, buf, 512);
        } else if (line[0] == 'S') {
            struct stat st;
            fstatat(root, path, &st, AT_SYMLINK_NOFOLLOW);
        } else {
            struct open_how how = {.flags = flags, .resolve = resolve};
            int fd = syscall(SYS_openat2, root, path, &how, sizeof how);
            if (fd >= 0) {
                if (line[0] == 'F') read(fd, buf, 512);
                else if (line[0] == 'D')
                    while (syscall(SYS_getdents64, fd, buf, sizeof buf) > 0) {}
                close(fd);
            }
        }
        line = end + 1;
    }
    return 0;
}
"#;

/// The value of each open flag strace names.
fn flag(name: &str) -> u64 {
    (match name {
        "O_RDONLY" => 0,
        "O_CLOEXEC" => libc::O_CLOEXEC,
        "O_PATH" => libc::O_PATH,
        "O_NOFOLLOW" => libc::O_NOFOLLOW,
        "O_NONBLOCK" => libc::O_NONBLOCK,
        "O_NOCTTY" => libc::O_NOCTTY,
        "O_DIRECTORY" => libc::O_DIRECTORY,
        other => panic!("open flag {other} (add it here)"),
    }) as u64
}

/// The value of each resolve flag strace names.
fn resolve(name: &str) -> u64 {
    match name {
        "RESOLVE_BENEATH" => libc::RESOLVE_BENEATH,
        "RESOLVE_NO_SYMLINKS" => libc::RESOLVE_NO_SYMLINKS,
        "RESOLVE_NO_MAGICLINKS" => libc::RESOLVE_NO_MAGICLINKS,
        "RESOLVE_NO_XDEV" => libc::RESOLVE_NO_XDEV,
        other => panic!("resolve flag {other} (add it here)"),
    }
}

/// The calls nodefabric made beneath `root`, from an strace log without
/// `-y`: its handle on the root is the fd the first `open*` of the root
/// returned; every `openat2`, `readlinkat` and `newfstatat` on that fd is
/// a line for [`SOURCE`].
fn calls(log: &str, root: &Path) -> Vec<String> {
    let root_text = format!("\"{}\"", root.display());
    let mut fd = None;
    let mut out = Vec::new();
    for line in log.lines() {
        let call = line.split_once(' ').map_or(line, |(_, c)| c).trim_start();
        if fd.is_none() && call.starts_with("openat(") && call.contains(&root_text) {
            fd = call
                .rsplit_once(" = ")
                .and_then(|(_, r)| r.trim().parse::<i64>().ok());
            continue;
        }
        let Some(fd) = fd else { continue };
        let prefix = |name: &str| format!("{name}({fd}, \"");
        if let Some(rest) = call.strip_prefix(&prefix("readlinkat")) {
            let path = &rest[..rest.find('"').expect("quoted path")];
            out.push(format!("L 0 0 {path}"));
        } else if let Some(rest) = call.strip_prefix(&prefix("newfstatat")) {
            let path = &rest[..rest.find('"').expect("quoted path")];
            out.push(format!("S 0 0 {path}"));
        } else if let Some(rest) = call.strip_prefix(&prefix("openat2")) {
            let path = &rest[..rest.find('"').expect("quoted path")];
            let how = &rest[rest.find("{flags=").expect("open_how") + 7..];
            let (flags, how) = how.split_once(", resolve=").expect("resolve");
            let res = &how[..how.find('}').expect("end of open_how")];
            // The root opened as `.` is the check that `openat2` works,
            // closed unlisted.
            let kind = if flags.contains("O_PATH") || path == "." {
                'P'
            } else if flags.contains("O_DIRECTORY") {
                'D'
            } else {
                'F'
            };
            let f: u64 = flags.split('|').map(flag).fold(0, |a, b| a | b);
            let r: u64 = res.split('|').map(resolve).fold(0, |a, b| a | b);
            out.push(format!("{kind} {f} {r} {path}"));
        }
    }
    assert!(
        !out.is_empty(),
        "no calls beneath {} in the trace",
        root.display()
    );
    out
}

/// Runs the replay study at `endpoints`; its table rows.
fn study(
    endpoints: u32,
    rounds: usize,
    replayer: &Path,
    floor_bin: &Path,
    hook: &Path,
) -> Vec<String> {
    let site = floor::site(endpoints);
    let (dir, tree) = (&site.dir, &site.tree);
    let log = dir.path().join("calls.strace");
    let mut ours = Command::new(hook);
    ours.args(["features", "--sysfs-root"]).arg(tree);
    strace::run(
        &ours,
        &["-f", "-e", "trace=openat,openat2,readlinkat,newfstatat"],
        &log,
    );
    let all = calls(&fs::read_to_string(&log).unwrap(), tree);
    let write = |name: &str, keep: &dyn Fn(&str) -> bool| {
        let path = dir.path().join(name);
        let text: String = all
            .iter()
            .filter(|c| keep(c))
            .map(|c| format!("{c}\n"))
            .collect();
        fs::write(&path, text).unwrap();
        path
    };
    let count = |k: char| all.iter().filter(|c| c.starts_with(k)).count();
    let variants = [
        (
            format!("its calls replayed: {} `openat2` ({} files, {} folders listed, {} `O_PATH`), {} `readlinkat`, {} `fstatat`", count('F') + count('D') + count('P'), count('F'), count('D'), count('P'), count('L'), count('S')),
            write("all", &|_| true),
        ),
        (
            "the same without the `O_PATH` checks".to_string(),
            write("no-checks", &|c| !c.starts_with('P')),
        ),
        (
            "the same without the folder listings too".to_string(),
            write("no-listings", &|c| !c.starts_with('P') && !c.starts_with('D')),
        ),
    ];
    // Rotating order: nodefabric, each replay, the floor.
    let mut commands = vec![ours];
    for (_, list) in &variants {
        let mut c = Command::new(replayer);
        c.arg(list).arg(tree);
        commands.push(c);
    }
    let mut base = Command::new(floor_bin);
    base.arg(&site.manifest).arg(tree);
    commands.push(base);
    run_once(hook, tree);
    let n = commands.len();
    let mut times = vec![Vec::new(); n];
    for round in 0..rounds {
        for k in 0..n {
            let i = (k + round) % n;
            times[i].push(measured(&commands[i]).wall.as_secs_f64());
        }
    }
    let floor_times = &times[n - 1];
    let ratio = |i: usize| {
        let r: Vec<f64> = times[i]
            .iter()
            .zip(floor_times)
            .map(|(a, b)| a / b)
            .collect();
        quantile(r, 0.5)
    };
    let ms = |i: usize| quantile(times[i].clone(), 0.5) * 1e3;
    let mut rows = vec![format!(
        "| {endpoints} | `nodefabric features` | {:.2} | {:.2}x |",
        ms(0),
        ratio(0)
    )];
    for (i, (name, _)) in variants.iter().enumerate() {
        rows.push(format!(
            "| {endpoints} | {name} | {:.2} | {:.2}x |",
            ms(i + 1),
            ratio(i + 1)
        ));
    }
    rows.push(format!(
        "| {endpoints} | the floor | {:.2} | 1.00x |",
        ms(n - 1)
    ));
    for r in &rows {
        println!("{r}");
    }
    rows
}

/// `--replay`: the study at 8 and 512 endpoints; writes its section.
pub fn replay() {
    let work = tempfile::tempdir().unwrap();
    let replayer = floor::compile(work.path(), "replay", SOURCE);
    let floor_bin = floor::build(work.path());
    let (hook, _) = installed(work.path());
    let before = load();
    let mut rows = study(8, 201, &replayer, &floor_bin, &hook);
    rows.extend(study(512, 31, &replayer, &floor_bin, &hook));
    let after = load();
    let section = format!(
        "## Where the hook's time goes beyond its floor: its system calls replayed\n\n\
         `cargo bench --bench features -- --replay` (needs `strace` and `cc`): `nodefabric features` once under strace on the generated tree (`fixtures::large`, tmpfs); \
         a C program (`benches/support/replay.rs`) then makes exactly the calls nodefabric made beneath the tree, with the same flags and resolve modes: each `openat2`, \
         followed by one `read` of a file, the listing of a folder to its end or the `close` of an `O_PATH` check, each `readlinkat` and each `fstatat` (an RDMA device's `ports` counted); nothing else. \
         The replay without the `O_PATH` checks, and without the folder listings too, tells what each costs. Each program is run in rotating order, \
         with nodefabric and the floor, through the same measuring process as the table above ({} rounds at 8 endpoints, {} at 512); each ratio is the median of the \
         ratios to the floor of the same round. What the full replay costs over the floor is the system calls nodefabric adds to its reads; what nodefabric costs over \
         the full replay is its own work (start-up, parsing, the resolution cache, building the record and the labels). Load average (1 min) before and after: {before}, {after}.\n\n\
         | endpoints | program | ms (median) | over the floor |\n|---|---|---|---|\n{}\n",
        201,
        31,
        rows.join("\n")
    );
    report::write_section("Where the hook's time goes beyond its floor", &section);
}
