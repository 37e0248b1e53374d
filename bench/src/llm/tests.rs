//! Tests of `mod`.

use super::*;

fn page(rebuilds: u64, choices: [u64; 4]) -> String {
    let [returned, over_bound, sent_elsewhere, placed] = choices;
    format!(
        "# TYPE balancer_table_rebuilds_total counter\n\
         balancer_table_rebuilds_total{{vip=\"other\"}} 99\n\
         balancer_table_rebuilds_total{{vip=\"{VIP_NAME}\"}} {rebuilds}\n\
         # TYPE balancer_persistence_choices_total counter\n\
         balancer_persistence_choices_total{{result=\"returned\"}} {returned}\n\
         balancer_persistence_choices_total{{result=\"over_bound\"}} {over_bound}\n\
         balancer_persistence_choices_total{{result=\"sent_elsewhere\"}} {sent_elsewhere}\n\
         balancer_persistence_choices_total{{result=\"placed\"}} {placed}\n"
    )
}

#[test]
fn a_run_s_daemon_counts_are_the_difference_of_two_pages() {
    let before = DaemonCounts::from_page(&page(3, [10, 2, 1, 4])).unwrap();
    let after = DaemonCounts::from_page(&page(7, [40, 12, 1, 9])).unwrap();
    let run = after.since(&before);
    assert_eq!(run.table_rebuilds, 4.0);
    assert_eq!(
        run.persistence,
        PersistenceChoices {
            returned: 30.0,
            over_bound: 10.0,
            sent_elsewhere: 0.0,
            placed: 5.0,
        }
    );
    assert_eq!(run.persistence.returning(), 40.0);
    assert_eq!(run.persistence.total(), 45.0);
}

#[test]
fn each_address_s_busiest_server_is_the_one_that_served_most_of_its_requests() {
    let conv = |id: usize, source: &str| workload::Conversation {
        id,
        start: 0.0,
        source: source.parse().unwrap(),
        turns: Vec::new(),
    };
    let work = [
        conv(0, "10.0.0.1"),
        conv(1, "10.0.0.1"),
        conv(2, "10.0.0.2"),
    ];
    let served = |conversation: usize, backend: &str| Outcome {
        conversation,
        e2e: Some(1.0),
        backend: Some(backend.into()),
        ..Default::default()
    };
    let mut outcomes = vec![
        served(0, "gpu0-large"),
        served(1, "gpu0-large"),
        served(1, "gpu2-small"),
        served(0, "gpu0-large"),
        served(2, "gpu3-small"),
    ];
    // A failed request counts for no server.
    outcomes.push(Outcome {
        error: Some("refused".into()),
        ..served(2, "gpu1-large")
    });
    let homes = busiest_servers(&work, &outcomes);
    assert_eq!(homes.len(), 2);
    assert_eq!(
        homes[&"10.0.0.1".parse::<IpAddr>().unwrap()],
        ("gpu0-large".into(), 0.75)
    );
    assert_eq!(
        homes[&"10.0.0.2".parse::<IpAddr>().unwrap()],
        ("gpu3-small".into(), 1.0)
    );
}

#[test]
fn a_page_without_a_counter_is_an_error_naming_it() {
    let without = page(3, [1, 1, 1, 1]).replace("result=\"over_bound\"", "result=\"other\"");
    let err = DaemonCounts::from_page(&without).unwrap_err().to_string();
    assert!(err.contains("over_bound"), "{err}");
    let err = DaemonCounts::from_page("").unwrap_err().to_string();
    assert!(err.contains("balancer_table_rebuilds_total"), "{err}");
}
