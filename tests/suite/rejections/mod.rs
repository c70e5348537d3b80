//! Every refusal of bad input, in one place. Where a new one goes:
//!
//! - `library`: one hand-made fault per rule, checked through the library
//!   (the rule, file and tensor of the error; no output left behind).
//! - `corpus`: the hostile-input corpus, cases generated from the reference
//!   checkpoints and run through the library and the binary alike (the one
//!   `error:` line, the exit status, inputs untouched, nothing panics).
//!
//! Tests elsewhere check refusals only where they are part of a feature
//! (`--shards` names, a second run into the same directory).

mod corpus;
mod library;
