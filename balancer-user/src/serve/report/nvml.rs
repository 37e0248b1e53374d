//! GPU figures from NVML (`libnvidia-ml.so`, loaded at run time by `nvml-wrapper`, so a build
//! with this feature still runs, and fails with a clear error, on a host without the driver).

use nvml_wrapper::Nvml;

use super::gpu::GpuStats;

pub struct NvmlGpus {
    nvml: Nvml,
}

impl NvmlGpus {
    pub fn open() -> Result<NvmlGpus, String> {
        let nvml = Nvml::init().map_err(|e| {
            format!("initialising NVML: {e} (is the NVIDIA driver installed? without it, use --gpu-stats-file or --no-gpu)")
        })?;
        Ok(NvmlGpus { nvml })
    }

    pub fn read(&self) -> Result<Vec<GpuStats>, String> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| format!("NVML device count: {e}"))?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self
                .nvml
                .device_by_index(index)
                .map_err(|e| format!("NVML device {index}: {e}"))?;
            let memory = device
                .memory_info()
                .map_err(|e| format!("NVML memory of GPU {index}: {e}"))?;
            // Utilisation is not supported on MIG instances: unknown, not an error.
            let utilization = device
                .utilization_rates()
                .ok()
                .map(|u| f64::from(u.gpu.min(100)) / 100.0);
            gpus.push(GpuStats {
                index,
                name: device.name().unwrap_or_else(|_| "unknown".into()),
                memory_used_bytes: memory.used.min(memory.total),
                memory_total_bytes: memory.total,
                utilization,
            });
        }
        Ok(gpus)
    }
}
