//! What the simulator's tests share: running the built binary and reading its flat JSON.

#![allow(dead_code)] // each test file uses what it needs

use std::process::{Command, Output};

/// Runs the built `skv-sim` with `args`.
pub fn sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_skv-sim")).args(args).output().expect("skv-sim runs")
}

/// The value of `"key":` in one line of skv-sim's flat JSON.
pub fn field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\":");
    let at = json.find(&pat).unwrap_or_else(|| panic!("no {key} in {json}")) + pat.len();
    let rest = &json[at..];
    &rest[..rest.find([',', '}']).unwrap_or(rest.len())]
}

pub fn num(json: &str, key: &str) -> u64 {
    field(json, key).parse().unwrap_or_else(|_| panic!("{key} is not a count in {json}"))
}

pub fn real(json: &str, key: &str) -> f64 {
    field(json, key).parse().unwrap_or_else(|_| panic!("{key} is not a number in {json}"))
}
