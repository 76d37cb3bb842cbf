//! The commands of the docs, as the tests run them. A test does not copy a documented
//! command into its own source: it asks for it here by its first words
//! ([`doc_command`]), gives values for the docs' placeholders (a served URL for
//! `https://charts.example.com`, the token for `<token>`), and runs what the docs say.
//! `tests/docs.rs` holds that every command in the docs is either asked for by some test
//! in this way or listed there with the reason it is not run literally; so a command
//! changed in the docs is a command changed in the tests, and a new one fails the suite
//! until a test runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The pages whose `sh` blocks are read: the README, `docs/`, the chart's README.
pub fn pages() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut pages = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages.push(root.join("charts/autonomic/README.md"));
    pages
}

/// The commands of one page's `sh`/`bash`/`console` blocks: continuation lines joined,
/// comments (a line starting with `#`, or ` # …` after a command) left out.
pub fn commands_of(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_block = false;
    let mut pending = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            in_block = !in_block && matches!(info.trim(), "sh" | "bash" | "console");
            pending.clear();
            continue;
        }
        if !in_block || trimmed.starts_with('#') {
            continue;
        }
        let code = trimmed.split(" # ").next().unwrap().trim_end();
        match code.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head.trim_end());
                pending.push(' ');
            }
            None => {
                pending.push_str(code);
                let command = std::mem::take(&mut pending).trim().to_owned();
                if !command.is_empty() {
                    commands.push(command);
                }
            }
        }
    }
    commands
}

/// Every documented command with its page (relative to the project's root).
pub fn all() -> Vec<(String, String)> {
    pages()
        .iter()
        .flat_map(|page| {
            let name = page.strip_prefix(ROOT).unwrap().display().to_string();
            let name = name.trim_start_matches('/').to_owned();
            commands_of(&std::fs::read_to_string(page).unwrap())
                .into_iter()
                .map(move |c| (name.clone(), c))
        })
        .collect()
}

/// A documented command, its placeholders filled: the program and its arguments, and
/// the file its output goes to when the docs redirect it (`> autonomic.yaml`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocCommand {
    pub argv: Vec<String>,
    pub stdout_to: Option<String>,
}

impl DocCommand {
    /// The command ready to run: `helm` is the suite's Helm, `scripts/…` the project's
    /// scripts; the caller adds what the bed needs (`.args`, `.env`).
    pub fn command(&self) -> Command {
        let program = match self.argv[0].as_str() {
            "helm" => super::helm(),
            p if p.starts_with("scripts/") => format!("{ROOT}/{p}"),
            p => p.to_owned(),
        };
        let mut cmd = Command::new(program);
        cmd.args(&self.argv[1..]);
        cmd
    }

    /// The arguments after the program, as `&str`s (for `HelmRelease::helm`).
    pub fn args(&self) -> Vec<&str> {
        self.argv[1..].iter().map(String::as_str).collect()
    }
}

/// The documented command that starts with `prefix`, with each `(placeholder, value)` of
/// `values` replaced. Every page that documents a command with that start must say the
/// same once filled (else this panics, naming both), and no `<placeholder>` may be left.
pub fn doc_command(prefix: &str, values: &[(&str, &str)]) -> DocCommand {
    let found: Vec<(String, DocCommand)> = all()
        .into_iter()
        .filter(|(_, c)| c.starts_with(prefix))
        .map(|(page, c)| (page, fill(&c, values)))
        .collect();
    let Some((first_page, first)) = found.first() else {
        panic!("no command in the docs starts with {prefix:?}: did the docs change?");
    };
    for (page, other) in &found[1..] {
        assert_eq!(
            other, first,
            "{page} and {first_page} document {prefix:?} differently"
        );
    }
    first.clone()
}

fn fill(command: &str, values: &[(&str, &str)]) -> DocCommand {
    let mut text = command.to_owned();
    for (placeholder, value) in values {
        text = text.replace(placeholder, value);
    }
    assert!(
        !(text.contains('<') && text.contains('>') && text.find('<') < text.rfind('>')),
        "a placeholder of {command:?} has no value: {text}"
    );
    let mut argv: Vec<String> = text.split_whitespace().map(String::from).collect();
    let stdout_to = match argv.iter().position(|a| a == ">") {
        Some(i) => {
            let to = argv.get(i + 1).cloned();
            argv.truncate(i);
            to
        }
        None => None,
    };
    DocCommand { argv, stdout_to }
}
