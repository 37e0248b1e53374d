//! The program's XDP links, each pinned so it outlives the daemon: one on the clients'
//! interface, and one on `[nat] interface` when the config names the NAT backends' own link.
//! A daemon attaches them fresh, adopts them as an earlier one left them, or replaces the
//! program in them atomically (`--replace`).

use std::path::Path;

use anyhow::{Context as _, Result};
use aya::Ebpf;
use aya::programs::Xdp;
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::xdp::XdpLink;
use aya_obj::programs::XdpAttachType;

use crate::base::config::{AttachMode, Config};
use crate::dataplane::ebpf::{self, xdp_mode};
use crate::dataplane::pinning::Pins;

/// How a daemon comes to the program it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Nothing was pinned: this binary's program, attached afresh.
    Fresh,
    /// The pinned program keeps running as it is.
    Adopt,
    /// This binary's program replaces the pinned one in its links.
    Replace,
}

/// Makes the links `config` asks for: the clients' interface's and the NAT backends' (see
/// [`Start`]), with the program of `object` (already loaded) where one is attached or
/// replaced. A NAT link the config no longer names is detached.
pub fn attach_links(object: &mut Ebpf, pins: &Pins, config: &Config, start: Start) -> Result<()> {
    let program = ebpf::program(object, ebpf::BALANCER_PROGRAM)?;
    match start {
        Start::Fresh => {
            attach_pinned(program, &config.interface, config.attach_mode, &pins.link())?
        }
        Start::Replace => replace_in(program, &pins.link())?,
        Start::Adopt => {}
    }
    if start != Start::Adopt {
        let _ = std::fs::remove_file(pins.program());
        program.pin(pins.program()).context("pinning the program")?;
    }
    let wanted = config
        .nat
        .interface
        .as_deref()
        .map(|i| (i, pins.nat_link(i)));
    for stale in pins
        .nat_links()
        .with_context(|| format!("listing {}", pins.dir().display()))?
    {
        if wanted.as_ref().is_none_or(|(_, w)| *w != stale) {
            std::fs::remove_file(&stale)
                .with_context(|| format!("unpinning {}", stale.display()))?;
            tracing::info!(
                link = %stale.display(),
                "detached from a NAT backends' interface the config no longer names"
            );
        }
    }
    let Some((interface, pin)) = wanted else {
        return Ok(());
    };
    if pin.exists() {
        if start != Start::Adopt {
            replace_in(program, &pin)?;
        }
        return Ok(());
    }
    if start == Start::Adopt {
        // The program in force, not this binary's, runs on both links.
        let mut pinned = Xdp::from_pin(pins.program(), XdpAttachType::Interface)
            .context("opening the pinned program")?;
        attach_pinned(&mut pinned, interface, config.attach_mode, &pin)
    } else {
        attach_pinned(program, interface, config.attach_mode, &pin)
    }
}

/// Attaches `program` to `interface` in `mode` and pins the link at `pin`.
fn attach_pinned(program: &mut Xdp, interface: &str, mode: AttachMode, pin: &Path) -> Result<()> {
    let link_id = program
        .attach(interface, xdp_mode(mode))
        .with_context(|| format!("attaching XDP to {interface} in {mode} mode"))?;
    let link = program.take_link(link_id)?;
    let fd_link = FdLink::try_from(link)
        .context("the XDP attachment is not a BPF link (kernel too old to pin it)")?;
    fd_link
        .pin(pin)
        .with_context(|| format!("pinning the XDP link of {interface}"))?;
    Ok(())
}

/// Puts `program` in place of the one in the link pinned at `pin`, atomically.
fn replace_in(program: &mut Xdp, pin: &Path) -> Result<()> {
    let pinned = PinnedLink::from_pin(pin)
        .with_context(|| format!("opening the pinned XDP link {}", pin.display()))?;
    let link =
        XdpLink::try_from(FdLink::from(pinned)).context("the pinned link is not an XDP link")?;
    program
        .attach_to_link(link)
        .with_context(|| format!("replacing the program in the XDP link {}", pin.display()))?;
    Ok(())
}
