//! Commands run under strace with chosen system calls stalled, so that the
//! moment a race or a kill needs comes for certain, not by luck: two runs
//! both past their directory listings, a commit caught between two renames.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `strace` set to run a command with `calls` (comma-separated system
/// calls) each held for `millis` after they return; append the program
/// and its arguments.
pub fn stalled(calls: &str, millis: u32) -> Command {
    let found = Command::new("strace").arg("-V").output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "these tests stall system calls with strace: install it (apt install strace)"
    );
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-o", "/dev/null"])
        .arg(format!("-etrace={calls}"))
        .arg(format!("-einject={calls}:delay_exit={}", millis * 1000))
        .arg("--");
    cmd
}

/// The process strace runs `program` in, once it runs.
pub fn traced(strace: &mut Child, program: &Path) -> u32 {
    let since = Instant::now();
    loop {
        if let Some(pid) = descendants(strace.id()).into_iter().find(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == program)
        }) {
            return pid;
        }
        assert!(
            strace.try_wait().unwrap().is_none(),
            "strace ended before its command ran"
        );
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "strace never started its command"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every process below `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut next = vec![pid];
    while let Some(p) = next.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}
