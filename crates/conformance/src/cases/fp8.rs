// PLACEHOLDER (lead) — helper-3 replaces this file
pub fn quantize_fp8_codes_amax_transpose<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("quantize_fp8_codes_amax_transpose", "placeholder");
    let _ = h;
}
pub fn quantize_fp8_many_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("quantize_fp8_many_matches_composition", "placeholder");
    let _ = h;
}
pub fn quantize_fp8_grad_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("quantize_fp8_grad_matches_composition", "placeholder");
    let _ = h;
}
pub fn quantize_fp8_gelu_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("quantize_fp8_gelu_matches_composition", "placeholder");
    let _ = h;
}
pub fn layernorm_forward_fp8_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("layernorm_forward_fp8_matches_composition", "placeholder");
    let _ = h;
}
pub fn gemm_fp8_matches_reference<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("gemm_fp8_matches_reference", "placeholder");
    let _ = h;
}
pub fn gemm_fp8_epilogue_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("gemm_fp8_epilogue_matches_composition", "placeholder");
    let _ = h;
}
pub fn fp8_scaling_update_matches_host<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("fp8_scaling_update_matches_host", "placeholder");
    let _ = h;
}
