//! Finding the adapter to decode on, the way wgpu's own tools do, and
//! saying why there is none.

/// Finds an adapter the way wgpu's own tools do: `WGPU_BACKEND` picks the
/// API, `WGPU_ADAPTER_NAME` (a substring, case-insensitive) the adapter,
/// `WGPU_POWER_PREF` the default choice. `None` when there is none.
pub fn find_adapter() -> Option<wgpu::Adapter> {
    pollster::block_on(find_adapter_async())
}

/// [`find_adapter`], awaited: in a browser, WebGPU's adapter.
pub async fn find_adapter_async() -> Option<wgpu::Adapter> {
    find_adapter_on_async(None).await
}

/// [`find_adapter_async`] among the adapters of the graphics APIs `only`
/// names (all those `WGPU_BACKEND` allows when `None`).
pub async fn find_adapter_on_async(only: Option<wgpu::Backends>) -> Option<wgpu::Adapter> {
    // A browser without WebGPU (or one that only pretends to have it).
    #[cfg(target_arch = "wasm32")]
    if !wgpu::util::is_browser_webgpu_supported().await {
        return None;
    }
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle_from_env();
    if let Some(only) = only {
        descriptor.backends = only;
    }
    let instance = wgpu::Instance::new(descriptor);
    if let Ok(name) = std::env::var("WGPU_ADAPTER_NAME") {
        let name = name.to_lowercase();
        let adapters = instance
            .enumerate_adapters(only.unwrap_or(wgpu::Backends::all()))
            .await;
        return adapters
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&name));
    }
    let options = wgpu::RequestAdapterOptions {
        power_preference: wgpu::PowerPreference::from_env()
            .unwrap_or(wgpu::PowerPreference::HighPerformance),
        ..Default::default()
    };
    instance.request_adapter(&options).await.ok()
}

/// Why [`find_adapter`] found none, naming the filters that were set, and
/// with `remedy` what to do about it.
pub fn no_adapter_message(remedy: bool) -> String {
    let filters: Vec<String> = ["WGPU_BACKEND", "WGPU_ADAPTER_NAME"]
        .iter()
        .filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}")))
        .collect();
    if cfg!(target_arch = "wasm32") {
        let fix = "; use backend 'cpu'";
        return format!(
            "this browser has no WebGPU adapter{}",
            if remedy { fix } else { "" }
        );
    }
    if filters.is_empty() {
        let fix = " (install a Vulkan driver, e.g. mesa-vulkan-drivers, or use --backend cpu)";
        return format!("no GPU adapter found{}", if remedy { fix } else { "" });
    }
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    let names: Vec<String> = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| format!("{} on {:?}", a.get_info().name, a.get_info().backend))
        .collect();
    format!(
        "no GPU adapter matches {} (adapters: {}){}",
        filters.join(" "),
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        },
        if remedy {
            "; change or unset it, or use --backend cpu"
        } else {
            ""
        }
    )
}

/// True for adapters that are real hardware (not llvmpipe / WARP).
pub fn is_hardware(adapter: &wgpu::Adapter) -> bool {
    adapter.get_info().device_type != wgpu::DeviceType::Cpu
}
