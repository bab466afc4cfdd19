//! Admission control and priority on a real server (SmolLM2-135M on the CPU): a full queue
//! answers 503 with `Retry-After` and OpenAI's error JSON while the accepted requests finish;
//! a more urgent request preempts a running one, whose output is still exactly its greedy
//! output alone.

use std::time::Duration;

use crate::common::*;
use serde_json::{json, Value};
use sparrow_engine::config::{PriorityConfig, QueueConfig};

async fn wait_for(s: &TestServer, what: &str, ok: impl Fn(&Value) -> bool) {
    for _ in 0..2000 {
        if ok(&stats(s).await) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("never saw {what}: {}", stats(s).await);
}

/// Priority scheduling, smaller values first or larger, preempting beyond `threshold`
/// (`None`: no preemption).
fn priority(low_values_first: bool, threshold: Option<i64>) -> QueueConfig {
    let p = PriorityConfig {
        low_values_first,
        preemption: threshold.is_some(),
        preemption_threshold: threshold.unwrap_or(10),
        default_priority: 0,
    };
    QueueConfig { priority: Some(p), ..Default::default() }
}

fn completion(prompt: &str, max_tokens: usize, priority: Option<i64>) -> Value {
    json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": true, "priority": priority})
}

/// `--max-queued-requests 1` with one request running and one waiting: the next is refused
/// with 503, `Retry-After: 1` and a server_error naming the flag (Anthropic's route: 529,
/// `overloaded_error`), counted in `/metrics`; the two accepted requests finish. A
/// `priority` that is not an integer is a 400 naming it.
#[tokio::test]
async fn a_full_queue_answers_503_and_the_accepted_requests_finish() {
    let queue = QueueConfig { max_queued_requests: Some(1), ..Default::default() };
    let s = TestServer::start(Opts { max_running_requests: Some(1), queue, ..Opts::default() });
    let (st, v) = post(&s, "/v1/completions", json!({"prompt": "Hi", "max_tokens": 1, "priority": "high"})).await;
    assert_eq!((st, v["error"]["param"].as_str()), (400, Some("priority")), "{v}");
    // One API request is admitted whole: three prompts on an idle server with a limit of 1.
    let (st, v) = post(&s, "/v1/completions", json!({"prompt": ["a", "b", "c"], "max_tokens": 2})).await;
    assert_eq!((st, v["choices"].as_array().map(Vec::len)), (200, Some(3)), "{v}");
    let (s1, s2) = (s.base.clone(), s.base.clone());
    let a = tokio::spawn(async move {
        let r = client().post(format!("{s1}/v1/completions")).json(&completion("Once upon a time", 120, None));
        r.send().await.expect("request").json::<Value>().await.expect("json")
    });
    wait_for(&s, "a running request", |st| st["num_running_reqs"] == 1).await;
    let b = tokio::spawn(async move {
        let r = client().post(format!("{s2}/v1/completions")).json(&completion("The sky is", 4, None));
        r.send().await.expect("request").json::<Value>().await.expect("json")
    });
    wait_for(&s, "a queued request", |st| st["num_queue_reqs"] == 1).await;
    let r = client().post(s.url("/v1/completions")).json(&completion("Hello", 4, None)).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 503);
    assert_eq!(r.headers().get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    let v: Value = r.json().await.expect("json");
    assert_eq!(v["error"]["type"], "server_error", "{v}");
    assert!(v["error"]["message"].as_str().unwrap_or("").contains("--max-queued-requests"), "{v}");
    let m = json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]});
    let r = client().post(s.url("/v1/messages")).json(&m).send().await.expect("send");
    assert_eq!(r.status().as_u16(), 529);
    assert!(r.headers().contains_key("retry-after"));
    let (a, b) = (a.await.expect("task"), b.await.expect("task"));
    assert_eq!(
        (a["usage"]["completion_tokens"].as_u64(), b["usage"]["completion_tokens"].as_u64()),
        (Some(120), Some(4))
    );
    let metrics = client().get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("sparrow:queue_full_rejections_total 2"), "{metrics}");
    assert_drained(&s).await;
}

/// Under priority scheduling a full queue keeps the most urgent requests: an arrival more
/// urgent than a waiting request takes its place (that one is answered 503), one that is not
/// is answered 503 itself (SGLang's queue-limit abort by priority).
#[tokio::test]
async fn a_full_queue_keeps_the_more_urgent_request() {
    let queue = QueueConfig { max_queued_requests: Some(1), ..priority(false, None) };
    let s = TestServer::start(Opts { max_running_requests: Some(1), queue, ..Opts::default() });
    let send = |body: Value| {
        let base = s.base.clone();
        tokio::spawn(async move {
            let r = client().post(format!("{base}/v1/completions")).json(&body).send().await.expect("request");
            (r.status().as_u16(), r.json::<Value>().await.expect("json"))
        })
    };
    let a = send(completion("Once upon a time", 100, Some(0)));
    wait_for(&s, "a running request", |st| st["num_running_reqs"] == 1).await;
    let b = send(completion("The sky is", 4, Some(0)));
    wait_for(&s, "a queued request", |st| st["num_queue_reqs"] == 1).await;
    let (st, v) = post(&s, "/v1/completions", completion("Hello", 4, Some(0))).await;
    assert_eq!(st, 503, "not more urgent than the waiting one: {v}");
    let (st, v) = post(&s, "/v1/completions", completion("Hello", 4, Some(100))).await;
    assert_eq!(st, 200, "more urgent: it takes the waiting one's place: {v}");
    let (b_status, b_body) = b.await.expect("task");
    assert_eq!(b_status, 503, "{b_body}");
    assert!(b_body["error"]["message"].as_str().unwrap_or("").contains("more urgent"), "{b_body}");
    assert_eq!(a.await.expect("task").0, 200);
    let metrics = client().get(s.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    assert!(metrics.contains("sparrow:queue_full_rejections_total 2"), "{metrics}");
    assert_drained(&s).await;
}

/// Priority scheduling, smaller values first, preemption beyond a difference of 5: with the
/// one running slot taken by a priority-10 request, a priority-0 arrival preempts it and
/// finishes first; the preempted request's text is its greedy text alone.
#[tokio::test]
async fn an_urgent_request_preempts_and_the_preempted_output_is_exact() {
    let queue = priority(true, Some(5));
    let s = TestServer::start(Opts { max_running_requests: Some(1), queue, ..Opts::default() });
    let long = "Write a long story about a fox.";
    let (st, alone) = post(&s, "/v1/completions", completion(long, 60, Some(10))).await;
    assert_eq!(st, 200, "{alone}");
    post(&s, "/flush_cache", json!({})).await;
    let base = s.base.clone();
    let a = tokio::spawn(async move {
        let r = client().post(format!("{base}/v1/completions")).json(&completion(long, 60, Some(10)));
        let v = r.send().await.expect("request").json::<Value>().await.expect("json");
        (v, std::time::Instant::now())
    });
    wait_for(&s, "the long request decoding", |st| {
        st["num_running_reqs"] == 1 && st["generation_tokens_total"].as_u64() > Some(70)
    })
    .await;
    let (st, urgent) = post(&s, "/v1/completions", completion("The capital of France is", 5, Some(0))).await;
    let urgent_done = std::time::Instant::now();
    assert_eq!(st, 200, "{urgent}");
    let (preempted, long_done) = a.await.expect("task");
    assert!(urgent_done < long_done, "the urgent request finished first");
    assert_eq!(text0(&preempted), text0(&alone), "a preempted request recomputes exactly");
    let st = stats(&s).await;
    assert_eq!(st["num_preemptions"], 1, "{st}");
    assert_drained(&s).await;
}
