// The products' entry points on devices with subgroups (wgpu's SUBGROUP
// feature), appended to the decode module (shaders/decode/) and the
// products' fragments (shaders/matmul/).

@compute @workgroup_size(WG)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) size: u32) {
    product(wid, li, Subgroup(lane, size));
}

@compute @workgroup_size(WG)
fn gemv_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    product_rows(wid, li);
}

@compute @workgroup_size(WG)
fn gemv_t(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
          @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) size: u32) {
    product_t(wid, li, Subgroup(lane, size));
}

@compute @workgroup_size(WG)
fn gemv_dense(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
              @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) size: u32) {
    product_dense(wid, li, Subgroup(lane, size));
}

// Lane `i`'s `v`.
fn shuffle4(v: vec4<f32>, i: u32) -> vec4<f32> {
    return subgroupShuffle(v, i);
}

fn shuffle1(v: f32, i: u32) -> f32 {
    return subgroupShuffle(v, i);
}
