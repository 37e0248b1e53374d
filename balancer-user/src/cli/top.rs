//! `balancer top`: a live terminal view of the VIPs and their backends (ratatui), refreshed
//! from the daemon's `status` and `weights` every interval; `q`, Esc or Ctrl-C quits.

use std::collections::HashMap;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use balancer::serve::api::client::Client;
use balancer::state::wire::{BackendStatus, Status, VipStatus, VipWeights, WeightRow};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Paragraph, Row, Table};

use super::EXIT_INVALID;
use super::client_args::{ClientArgs, si};

/// A live view of the VIPs and backends: weight, table share, KV-cache use, requests running
/// and waiting (from the backends' reports), flows, packets per second and health, refreshed
/// every second. Quit with q.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  balancer top\n  balancer top --interval-ms 500\n  \
                        balancer --connect lb1:9180 --token-file /etc/balancer/api-token --ca /etc/balancer/ca.pem top"
)]
pub struct TopArgs {
    /// Between refreshes (100 to 60000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
}

/// What one refresh read.
struct View {
    status: Status,
    /// Reports per (VIP name, backend).
    reports: HashMap<(String, IpAddr), WeightRow>,
}

fn fetch(client: &Client) -> Result<View, String> {
    let status: Status = client.get("/v1/status").map_err(|e| e.to_string())?;
    let weights: Vec<VipWeights> = client.get("/v1/weights").map_err(|e| e.to_string())?;
    let reports = weights
        .into_iter()
        .flat_map(|v| {
            let vip = v.vip;
            v.backends
                .into_iter()
                .map(move |b| ((vip.clone(), b.address), b))
        })
        .collect();
    Ok(View { status, reports })
}

pub fn run(args: TopArgs, opts: &ClientArgs) -> anyhow::Result<ExitCode> {
    if opts.json {
        eprintln!("error: top draws a terminal view; for JSON use `balancer status --json`");
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        eprintln!("error: top needs a terminal; use `balancer status` otherwise");
        return Ok(ExitCode::from(EXIT_INVALID));
    }
    let client = opts.client()?;
    let interval = Duration::from_millis(args.interval_ms);
    let mut terminal = ratatui::try_init()?;
    let result = (|| -> anyhow::Result<()> {
        loop {
            let view = fetch(&client);
            let read_at = time_of_day();
            let deadline = Instant::now() + interval;
            loop {
                terminal.draw(|frame| draw(frame, &view, &read_at, interval))?;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !event::poll(left)? {
                    break;
                }
                match event::read()? {
                    Event::Key(k) if k.kind == KeyEventKind::Press => {
                        let ctrl_c = k.code == KeyCode::Char('c')
                            && k.modifiers.contains(KeyModifiers::CONTROL);
                        if ctrl_c || matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) {
                            return Ok(());
                        }
                    }
                    // A resize redraws at once; anything else waits for the next refresh.
                    Event::Resize(..) => {}
                    _ => {}
                }
            }
        }
    })();
    ratatui::restore();
    result.map(|()| ExitCode::SUCCESS)
}

/// The wall-clock time of day (UTC), for the header.
fn time_of_day() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
        % 86_400;
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A VIP's box: its backends' weight, table share, load and health.
fn vip_table<'a>(view: &View, v: &'a VipStatus) -> Table<'a> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let rows = v.backends.iter().map(|b| backend_row(view, v, b));
    let title = format!(
        " {} {}/{} {} · {} · {}pps · {} flows{} ",
        v.name,
        std::net::SocketAddr::new(v.address, v.port),
        v.protocol,
        v.forwarding,
        v.scheduler,
        si(v.pps),
        v.flows,
        if v.announced { " · announced" } else { "" }
    );
    Table::new(
        rows,
        [
            Constraint::Length(40),
            Constraint::Length(7),
            Constraint::Length(7),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(10),
        ],
    )
    .header(
        Row::new(vec![
            "BACKEND", "WEIGHT", "SHARE", "KV", "RUNNING", "WAITING", "FLOWS", "PPS", "HEALTH",
        ])
        .style(bold),
    )
    .block(Block::bordered().title(title))
}

/// A backend's line in its VIP's box.
fn backend_row(view: &View, v: &VipStatus, b: &BackendStatus) -> Row<'static> {
    let percent = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0));
    let count = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
    let report = view
        .reports
        .get(&(v.name.clone(), b.address))
        .and_then(|r| r.signals.as_ref());
    let state = if b.retiring {
        "retiring"
    } else if b.drained {
        "drained"
    } else if !b.healthy {
        "DOWN"
    } else {
        b.health.as_str()
    };
    Row::new(vec![
        b.address.to_string(),
        b.weight.to_string(),
        format!("{:.1}%", b.table_share * 100.0),
        percent(report.and_then(|r| r.kv_usage)),
        count(report.and_then(|r| r.running)),
        count(report.and_then(|r| r.waiting)),
        b.flows.to_string(),
        si(b.pps),
        state.to_string(),
    ])
}

fn draw(
    frame: &mut ratatui::Frame,
    view: &Result<View, String>,
    read_at: &str,
    interval: Duration,
) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let view = match view {
        Ok(view) => view,
        Err(e) => {
            let text = vec![
                Line::styled(format!("balancer top — {read_at} — q quits"), bold),
                Line::from(""),
                Line::from(format!("error: {e}")),
                Line::from(format!("(trying again every {} ms)", interval.as_millis())),
            ];
            frame.render_widget(Paragraph::new(text), frame.area());
            return;
        }
    };
    let s = &view.status;
    let mut header = format!(
        "balancer top — {} ({}), up {} s — {read_at}, every {} ms — q quits",
        s.interface,
        s.attach_mode,
        s.uptime_secs,
        interval.as_millis()
    );
    if let Some(f) = &s.fleet {
        header.push_str(&format!("  fleet {} epoch {}", f.role, f.epoch));
    }
    let mut heights = vec![Constraint::Length(1)];
    heights.extend(
        s.vips
            .iter()
            .map(|v| Constraint::Length(v.backends.len() as u16 + 3)),
    );
    heights.push(Constraint::Min(0));
    let areas = Layout::vertical(heights).split(frame.area());
    frame.render_widget(Paragraph::new(Line::styled(header, bold)), areas[0]);
    if s.vips.is_empty() {
        frame.render_widget(Paragraph::new("no VIPs"), areas[1]);
        return;
    }
    for (i, v) in s.vips.iter().enumerate() {
        frame.render_widget(vip_table(view, v), areas[i + 1]);
    }
}
