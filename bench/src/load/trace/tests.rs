use super::*;

/// The error of parsing `text`, with its causes.
fn error(text: &str) -> String {
    format!("{:#}", parse(text).unwrap_err())
}

#[test]
fn azure_rows_read_as_seconds_after_the_first() {
    let (t, format) = parse(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:15:46.6805900,374,44\n\
         2023-11-16 18:15:50.9951690,396,109\n\
         2023-11-17 00:00:00.0,10,1\n",
    )
    .unwrap();
    assert_eq!(format, Format::Azure);
    assert!((t[1].at - 4.314579).abs() < 1e-6, "{}", t[1].at);
    assert_eq!((t[0].prompt_tokens, t[0].output_tokens), (374, 44));
    // Across midnight.
    assert!((t[2].at - (86_400.0 - (18.0 * 3600.0 + 15.0 * 60.0 + 46.68059))).abs() < 1e-6);
    assert_eq!((t[2].session, t[2].blocks.len()), (None, 0));
}

#[test]
fn burstgpt_rows_find_their_columns_and_sessions() {
    let (t, format) = parse(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n\
         5.0,ChatGPT,472,18,490,Conversation log\n\
         1.5,GPT-4,1087,0,1087,API log\n",
    )
    .unwrap();
    assert_eq!(format, Format::BurstGpt);
    // Sorted by time, from the first.
    assert_eq!(t[0].prompt_tokens, 1087);
    assert_eq!((t[1].at, t[1].output_tokens, t[1].session), (3.5, 18, None));
    let (t, _) = parse(
        "Session ID,Timestamp,Request tokens,Response tokens\n\
         17,0.0,100,10\n\
         abc,1.0,200,20\n\
         17,2.0,300,30\n",
    )
    .unwrap();
    assert_eq!(t[0].session, Some(17));
    assert_eq!(t[2].session, Some(17));
    assert!(t[1].session.is_some() && t[1].session != Some(17));
}

#[test]
fn mooncake_lines_keep_their_blocks() {
    let (t, format) = parse(
        "{\"timestamp\": 27482, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47, 48]}\n\
         \n\
         {\"timestamp\": 30535, \"input_length\": 6472, \"output_length\": 26, \"hash_ids\": [46, 47, 49]}\n",
    )
    .unwrap();
    assert_eq!(format, Format::Mooncake);
    assert!((t[1].at - 3.053).abs() < 1e-9);
    assert_eq!(t[0].blocks, vec![46, 47, 48]);
    assert_eq!(
        (t[1].prompt_tokens, t[1].output_tokens, &t[1].blocks[..2]),
        (6472, 26, &t[0].blocks[..2])
    );
}

#[test]
fn bad_traces_name_the_line_and_the_field() {
    let azure = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
    for (text, expect) in [
        ("", "empty"),
        ("a,b,c\n1,2,3\n", "not a trace header"),
        (azure, "no requests"),
        (
            &format!("{azure}2023-11-16 18:15:46.6,x,1\n") as &str,
            "line 2: ContextTokens \"x\"",
        ),
        (
            &format!("{azure}2023-11-16 18:15:46.6,1\n"),
            "line 2: 2 fields",
        ),
        (
            &format!("{azure}2023-13-16 18:15:46.6,1,1\n"),
            "line 2: TIMESTAMP",
        ),
        (
            &format!("{azure}2023-11-16 18:15:46.6,1,99999999999\n"),
            "GeneratedTokens 99999999999 is over",
        ),
        (
            "Timestamp,Request tokens,Response tokens\n1.0,2\n",
            "line 2: 2 fields, the header names 3",
        ),
        (
            "Timestamp,Request tokens,Response tokens\nNaN,2,3\n",
            "Timestamp NaN is not a time",
        ),
        (
            "Timestamp,Request tokens,Response tokens\n-1,2,3\n",
            "Timestamp -1 is not a time",
        ),
        (
            "Session ID,Timestamp,Request tokens,Response tokens\n,1,2,3\n",
            "Session ID: empty",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 2}\n",
            "line 1: no output_length field",
        ),
        (
            "{\"timestamp\": \"1\", \"input_length\": 2, \"output_length\": 3}\n",
            "timestamp \"1\" is not a number",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 2.5, \"output_length\": 3}\n",
            "input_length \"2.5\" is not a whole number",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3, \"hash_ids\": [1, -2]}\n",
            "hash_ids: -2 is not a block id",
        ),
        (
            "{\"timestamp\": 1, \"input_length\": 2, \"output_length\": 3}\n{oops\n",
            "line 2: not a JSON object",
        ),
    ] {
        let e = error(text);
        assert!(e.contains(expect), "{text:?}: {e}");
    }
}

#[test]
fn the_shipped_excerpt_reads_through_the_same_reader() {
    let t = shipped_trace().unwrap();
    assert_eq!(t.len(), 2400);
    assert_eq!(t[0].at, 0.0);
    assert!(t.windows(2).all(|w| w[0].at <= w[1].at));
    // 18:15:46 to 18:24:13, as bench/data/README.md says.
    assert!((500.0..510.0).contains(&t[2399].at), "{}", t[2399].at);
    let e = format!(
        "{:#}",
        read_trace(Path::new("/nonexistent/trace.csv")).unwrap_err()
    );
    assert!(e.contains("reading /nonexistent/trace.csv"), "{e}");
}
