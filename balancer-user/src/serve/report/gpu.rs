//! GPU figures for reports: where they come from (NVML, or a file of `nvidia-smi` CSV output
//! for hosts where the reporter is built without NVML), how they add up into a backend's
//! signals, and how they are served as a DCGM-exporter-style page.

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::steering::telemetry::signals::Signals;

const MIB: u64 = 1024 * 1024;

/// The command whose output `--gpu-stats-file` reads.
pub const NVIDIA_SMI_QUERY: &str = "nvidia-smi --query-gpu=index,name,memory.used,memory.total,utilization.gpu --format=csv,noheader,nounits";

/// One GPU.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct GpuStats {
    pub index: u32,
    pub name: String,
    pub memory_used_bytes: u64,
    pub memory_total_bytes: u64,
    /// 0..1; absent where the GPU does not report it (MIG instances).
    pub utilization: Option<f64>,
}

/// Where GPU figures come from.
pub enum GpuSource {
    #[cfg(feature = "nvml")]
    Nvml(Box<super::nvml::NvmlGpus>),
    /// A file holding the output of [`NVIDIA_SMI_QUERY`], re-read every round.
    StatsFile(PathBuf),
    /// No GPU figures (a page of the inference server alone).
    None,
}

impl GpuSource {
    pub fn read(&self) -> Result<Vec<GpuStats>, String> {
        match self {
            #[cfg(feature = "nvml")]
            GpuSource::Nvml(nvml) => nvml.read(),
            GpuSource::StatsFile(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("reading {}: {e}", path.display()))?;
                parse_nvidia_smi_csv(&text).map_err(|e| format!("{}: {e}", path.display()))
            }
            GpuSource::None => Ok(Vec::new()),
        }
    }
}

/// Parses `index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]` lines.
pub fn parse_nvidia_smi_csv(text: &str) -> Result<Vec<GpuStats>, String> {
    let mut gpus = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let at = |what: String| format!("line {}: {what}", n + 1);
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if fields.len() != 5 {
            return Err(at(format!(
                "expected 5 comma-separated fields (index, name, memory.used, memory.total, utilization.gpu), found {}",
                fields.len()
            )));
        }
        let number = |i: usize, what: &str| -> Result<u64, String> {
            fields[i].parse::<u64>().map_err(|_| {
                at(format!(
                    "{what} {:?} is not a whole number (use --format=csv,noheader,nounits)",
                    fields[i]
                ))
            })
        };
        let index = number(0, "index")? as u32;
        let used = number(2, "memory.used")?;
        let total = number(3, "memory.total")?;
        if used > total {
            return Err(at(format!(
                "memory.used {used} MiB exceeds memory.total {total} MiB"
            )));
        }
        let utilization = match fields[4] {
            "[N/A]" | "N/A" => None,
            u => {
                let pct = u
                    .parse::<f64>()
                    .ok()
                    .filter(|p| (0.0..=100.0).contains(p))
                    .ok_or_else(|| at(format!("utilization.gpu {u:?} is not a percentage")))?;
                Some(pct / 100.0)
            }
        };
        gpus.push(GpuStats {
            index,
            name: fields[1].to_string(),
            memory_used_bytes: used * MIB,
            memory_total_bytes: total * MIB,
            utilization,
        });
    }
    Ok(gpus)
}

/// The backend's GPU signals: memory summed over its GPUs, utilisation averaged.
pub fn signals(gpus: &[GpuStats]) -> Signals {
    if gpus.is_empty() {
        return Signals::default();
    }
    let utils: Vec<f64> = gpus.iter().filter_map(|g| g.utilization).collect();
    Signals {
        gpu_memory_used_bytes: Some(gpus.iter().map(|g| g.memory_used_bytes as f64).sum()),
        gpu_memory_total_bytes: Some(gpus.iter().map(|g| g.memory_total_bytes as f64).sum()),
        gpu_utilization: (!utils.is_empty())
            .then(|| utils.iter().sum::<f64>() / utils.len() as f64),
        ..Signals::default()
    }
}

/// The GPUs as the DCGM exporter names them (framebuffer in MiB, utilisation in %), so the
/// daemon scrapes a reporter exactly like a DCGM exporter.
pub fn render_dcgm(gpus: &[GpuStats], hostname: &str) -> String {
    let mut out = String::new();
    let escape = |s: &str| {
        s.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    type Family = (&'static str, &'static str, fn(&GpuStats) -> Option<f64>);
    let families: [Family; 3] = [
        (
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB).",
            |g| Some((g.memory_used_bytes / MIB) as f64),
        ),
        (
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB).",
            |g| Some(((g.memory_total_bytes - g.memory_used_bytes) / MIB) as f64),
        ),
        ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", |g| {
            g.utilization.map(|u| (u * 100.0).round())
        }),
    ];
    for (name, help, value) in families {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for g in gpus {
            if let Some(v) = value(g) {
                let _ = writeln!(
                    out,
                    "{name}{{gpu=\"{}\",modelName=\"{}\",Hostname=\"{}\"}} {v}",
                    g.index,
                    escape(&g.name),
                    escape(hostname)
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::steering::telemetry::{page, signals::extract};

    const SMI: &str = "0, NVIDIA H200, 61440, 143771, 87\n1, NVIDIA H200, 1024, 143771, [N/A]\n";

    #[test]
    fn nvidia_smi_output_parses() {
        let gpus = parse_nvidia_smi_csv(SMI).unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].name, "NVIDIA H200");
        assert_eq!(gpus[0].memory_used_bytes, 61440 * MIB);
        assert_eq!(gpus[0].utilization, Some(0.87));
        assert_eq!(gpus[1].utilization, None);
        let s = signals(&gpus);
        assert_eq!(s.gpu_memory_total_bytes, Some(2.0 * 143771.0 * MIB as f64));
        assert_eq!(s.gpu_utilization, Some(0.87));
    }

    #[test]
    fn bad_nvidia_smi_output_names_the_line_and_field() {
        let e = parse_nvidia_smi_csv(
            "index, name, memory.used [MiB], memory.total [MiB], utilization.gpu [%]\n",
        )
        .unwrap_err();
        assert!(e.contains("line 1") && e.contains("index"), "{e}");
        let e = parse_nvidia_smi_csv("0, H200, 10, 20, 5\n1, H200, 30, 20, 5\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("exceeds"), "{e}");
        let e = parse_nvidia_smi_csv("0, H200, 10, 20\n").unwrap_err();
        assert!(e.contains("expected 5"), "{e}");
        let e = parse_nvidia_smi_csv("0, H200, 10, 20, 130\n").unwrap_err();
        assert!(e.contains("percentage"), "{e}");
    }

    #[test]
    fn the_served_page_reads_back_as_the_same_signals() {
        let gpus = parse_nvidia_smi_csv(SMI).unwrap();
        let page = render_dcgm(&gpus, "gpu-host-\"7\"");
        let back = extract(&page::parse(&page).unwrap());
        let direct = signals(&gpus);
        assert_eq!(back.gpu_memory_used_bytes, direct.gpu_memory_used_bytes);
        assert_eq!(back.gpu_memory_total_bytes, direct.gpu_memory_total_bytes);
        assert_eq!(back.gpu_utilization, direct.gpu_utilization);
    }
}
