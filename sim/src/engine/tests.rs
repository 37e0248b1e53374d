//! Tests of `engine`.

use super::*;

fn prompt(n: usize, seed: u32) -> Vec<Token> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ seed)
        .collect()
}

/// Steps until idle; returns the steps.
fn run(e: &mut Engine) -> Vec<Step> {
    let mut steps = Vec::new();
    for _ in 0..100_000 {
        if e.is_idle() {
            return steps;
        }
        steps.push(e.step());
    }
    panic!("never idle");
}

#[test]
fn a_lone_request_gets_prefill_then_one_token_per_step() {
    let mut e = Engine::new(Profile::large());
    e.submit(1, prompt(4000, 1), 3).unwrap();
    let s = e.step();
    assert_eq!(s.admitted, vec![(1, 0)]);
    // 4000 / 8000 tok/s = 500 ms of prefill + 30 ms + 0.2 ms.
    assert_eq!(s.duration, Duration::from_micros(530_200));
    assert_eq!(s.tokens, vec![(1, 1)]);
    assert_eq!(e.step().duration, Duration::from_micros(30_200));
    assert_eq!(e.step().finished, vec![1]);
    assert!(e.is_idle());
    assert_eq!(
        e.kv_usage(),
        0.0,
        "finished: its blocks are free (and cached)"
    );
    assert_eq!(
        (e.counters.prompt_tokens, e.counters.generation_tokens),
        (4000, 3)
    );
}

#[test]
fn long_prompts_are_prefilled_in_chunks_beside_running_decodes() {
    let mut e = Engine::new(Profile::small());
    e.submit(1, prompt(100, 1), 50).unwrap();
    e.step();
    // A 5,000-token prompt needs three steps of the 2,048-token budget; the first request
    // keeps decoding meanwhile (its token comes out of the budget first).
    e.submit(2, prompt(5000, 2), 5).unwrap();
    let s = e.step();
    assert_eq!(s.admitted, vec![(2, 0)]);
    assert_eq!(
        s.tokens,
        vec![(1, 2)],
        "no token for the half-prefilled one"
    );
    let s = e.step();
    assert_eq!(s.tokens, vec![(1, 3)]);
    let s = e.step();
    assert_eq!(
        s.tokens,
        vec![(1, 4), (2, 1)],
        "its last chunk, then a token"
    );
    // Both decoding: 60 ms + 2 x 1 ms.
    assert_eq!(e.step().duration, Duration::from_millis(62));
}

#[test]
fn a_repeated_prompt_skips_the_prefill_of_its_cached_blocks() {
    let mut e = Engine::new(Profile::large());
    let p = prompt(1000, 7);
    e.submit(1, p.clone(), 2).unwrap();
    let cold = e.step().duration;
    run(&mut e);
    // 62 full blocks of 16 are cached (992 tokens); 8 are computed again.
    e.submit(2, p, 2).unwrap();
    let step = e.step();
    assert_eq!(
        step.admitted,
        vec![(2, 992)],
        "admitted with its cached tokens"
    );
    let warm = step.duration;
    assert_eq!(cold, Duration::from_micros(155_200)); // 1000 / 8000 s + 30.2 ms
    assert_eq!(warm, Duration::from_micros(31_200)); // 8 / 8000 s + 30.2 ms
    assert_eq!(
        (e.counters.prefix_queries, e.counters.prefix_hits),
        (2000, 992)
    );
    // A prompt that shares only its first 500 tokens hits 31 blocks.
    let mut other = prompt(1000, 7);
    for t in &mut other[500..] {
        *t ^= 0xffff;
    }
    run(&mut e);
    e.submit(3, other, 1).unwrap();
    run(&mut e);
    assert_eq!(e.counters.prefix_hits, 992 + 496);
}

#[test]
fn an_answer_sent_back_in_the_next_turn_hits_the_blocks_it_filled() {
    let mut e = Engine::new(Profile::large());
    let first = prompt(40, 3);
    e.submit(1, first.clone(), 24).unwrap();
    run(&mut e);
    // Turn 2: turn 1's prompt and answer, then a new message.
    let mut second = first;
    second.extend((1..=24).map(output_token));
    second.extend(prompt(20, 9));
    e.submit(2, second, 1).unwrap();
    run(&mut e);
    // 40 + 24 = 64 tokens = 4 full blocks; the last generated token was never computed,
    // so the fourth block was not full when turn 1 ended: 3 blocks hit.
    assert_eq!(e.counters.prefix_hits, 48);
}

#[test]
fn cached_blocks_are_evicted_least_recently_freed_first_tail_before_prefix() {
    // 1,024 blocks. A 600-block prompt, then a 1,000-block one: the second takes the 424
    // blocks never used, then 576 of the first's, from its tail (freed first), so the
    // first's leading 24 blocks are still cached when it comes again.
    let mut e = Engine::new(Profile::small());
    let a = prompt(16 * 600, 1);
    e.submit(1, a.clone(), 1).unwrap();
    run(&mut e);
    e.submit(2, prompt(16 * 1000, 2), 1).unwrap();
    run(&mut e);
    e.submit(3, a, 1).unwrap();
    run(&mut e);
    assert_eq!(e.counters.prefix_hits, 24 * 16, "{:?}", e.counters);
}

#[test]
fn a_full_cache_preempts_the_latest_admitted_and_recomputes_it() {
    let mut e = Engine::new(Profile::small());
    // 16 requests of 960 prompt tokens (60 blocks each, 960 blocks in all) that each grow
    // by 200 tokens: the cache (1,024 blocks) cannot hold them all.
    for id in 0..16 {
        e.submit(id, prompt(960, id as u32), 200).unwrap();
    }
    let steps = run(&mut e);
    let preempted: Vec<RequestId> = steps.iter().flat_map(|s| s.preempted.clone()).collect();
    assert!(!preempted.is_empty());
    assert_eq!(e.counters.preemptions as usize, preempted.len());
    // Every request finishes with all its tokens, each counted once.
    let finished: usize = steps.iter().map(|s| s.finished.len()).sum();
    assert_eq!(finished, 16);
    assert_eq!(e.counters.generation_tokens, 16 * 200);
    assert_eq!(e.counters.prompt_tokens, 16 * 960);
    // The first admitted, at the head of the batch, is never the victim.
    assert!(!preempted.contains(&0), "{preempted:?}");
}

#[test]
fn the_batch_is_capped_and_oversized_requests_are_refused() {
    let mut e = Engine::new(Profile::small());
    for id in 0..40 {
        e.submit(id, prompt(10, 1), 10).unwrap();
    }
    e.step();
    assert_eq!(e.running(), Profile::small().max_num_seqs);
    assert_eq!(e.waiting(), 40 - 16);
    assert!(e.submit(99, prompt(16_000, 1), 1000).is_err());
    assert!(e.submit(99, Vec::new(), 10).is_err());
}

#[test]
fn words_are_tokens() {
    assert_eq!(
        tokenize("a b  a"),
        vec![word_token("a"), word_token("b"), word_token("a")]
    );
    assert_eq!(output_token(3), word_token("tok3"));
}

#[test]
fn a_profile_written_as_numbers_reads_back_and_names_its_bad_field() {
    let p = Profile::parse("h100:kv=65536:prefill=8000:decode=33.1125:batch=64").unwrap();
    assert_eq!(p.name, "h100");
    assert_eq!(p.kv_blocks, 4096);
    assert_eq!(p.max_num_seqs, 64);
    assert_eq!(p.max_batched_tokens, 8192);
    // A lone stream's step is 1/decode, 1/151 of it per request: the large profile's times.
    let large = Profile::large();
    // Within 10 µs: the text keeps four decimals.
    let close = |a: Duration, b: Duration| (a.as_secs_f64() - b.as_secs_f64()).abs() < 1e-5;
    assert!(close(p.step_base, large.step_base), "{:?}", p.step_base);
    assert!(
        close(p.step_per_seq, large.step_per_seq),
        "{:?}",
        p.step_per_seq
    );
    // What `spec` writes, `parse` reads back the same.
    for q in [p.clone(), Profile::small()] {
        let again = Profile::parse(&q.spec()).unwrap();
        assert_eq!(again.kv_blocks, q.kv_blocks);
        assert_eq!(again.max_num_seqs, q.max_num_seqs);
        assert_eq!(again.max_batched_tokens, q.max_batched_tokens);
        assert!(close(again.step_base, q.step_base), "{}", q.spec());
        assert!(close(again.step_per_seq, q.step_per_seq), "{}", q.spec());
    }
    assert_eq!(Profile::parse("small").unwrap(), Profile::small());
    for (bad, says) in [
        ("huge", "expected large, small or NAME"),
        ("H100:kv=1", "NAME of 1-32"),
        ("h100:kv=65536:prefill=8000:decode=33", "batch= is missing"),
        (
            "h100:kv=65536:prefill=8000:decode=33:batch=64:speed=2",
            "unknown field \"speed\"",
        ),
        (
            "h100:kv=65536:prefill=NaN:decode=33:batch=64",
            "prefill=\"NaN\" must be",
        ),
        (
            "h100:kv=65536:prefill=inf:decode=33:batch=64",
            "prefill=\"inf\" must be",
        ),
        (
            "h100:kv=0:prefill=8000:decode=33:batch=64",
            "kv=\"0\" must be",
        ),
        (
            "h100:kv=65536:kv=1024:prefill=8000:decode=33:batch=64",
            "kv given twice",
        ),
        ("h100:kv", "\"kv\" is not KEY=VALUE"),
        (
            "h100:kv=65536:prefill=8000:decode=10:batch=4:per_seq_ms=200",
            "per_seq_ms must be below",
        ),
    ] {
        let e = Profile::parse(bad).unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
