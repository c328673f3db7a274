//! Issue 50 item 12: the walk-through in docs/user-guide.md ("From text to a model") runs as
//! written: every `duet` line of its shell block, in order, in a fresh folder, each succeeding,
//! and `duet eval` prints a perplexity. The corpus is the Debian/Ubuntu license texts it names;
//! where they are missing the test says SKIP with the reason (CI's Debian 12 has them).

mod common;
use common::*;

/// A shell line's words: spaces separate, double quotes group.
fn words(line: &str) -> Vec<String> {
    let (mut out, mut cur, mut quoted) = (Vec::new(), String::new(), false);
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[test]
fn the_user_guide_walk_through_runs_as_written() {
    let corpus = std::path::Path::new("/usr/share/common-licenses");
    if !corpus.is_dir() {
        eprintln!(
            "SKIP the_user_guide_walk_through_runs_as_written: no {}",
            corpus.display()
        );
        return;
    }
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/user-guide.md"))
        .unwrap();
    let section = guide
        .split("## From text to a model (a walk-through)")
        .nth(1)
        .expect("the walk-through section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its shell block");
    let commands: Vec<Vec<String>> = block
        .lines()
        .filter_map(|l| l.trim().strip_prefix("duet "))
        .map(words)
        .collect();
    assert_eq!(commands.len(), 5, "{block}");
    // common::duet runs every command in one folder of this test process.
    for args in &commands {
        let out = duet(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_success(&out);
        if args[0] == "eval" {
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("perplexity"), "{text}");
        }
    }
    assert!(tmp("cwd").join("ft/checkpoint.safetensors").exists());
}
