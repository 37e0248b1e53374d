//! Printing the outcome of a change.

use std::process::ExitCode;

use balancer::serve::api::client::ClientError;
use balancer::state::wire::ChangeResult;

use super::client_args::{ClientArgs, fail, print_json};

/// Prints a change's result (or its error) and returns the exit code.
pub fn report(args: &ClientArgs, result: Result<ChangeResult, ClientError>) -> ExitCode {
    match result {
        Ok(r) => {
            if args.json {
                print_json(&r);
            } else {
                let mut details = Vec::new();
                if r.tables_published > 0 {
                    details.push(format!(
                        "{} table(s) published, {} slots moved",
                        r.tables_published, r.slots_changed
                    ));
                }
                if details.is_empty() {
                    println!("{}", r.message);
                } else {
                    println!("{} ({})", r.message, details.join(", "));
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => fail(&e),
    }
}
