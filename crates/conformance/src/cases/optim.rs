// PLACEHOLDER (lead) — helper-3 replaces this file
pub fn adamw_all_grad_and_copy_dtypes<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("adamw_all_grad_and_copy_dtypes", "placeholder");
    let _ = h;
}
pub fn sum_squares_matches_and_is_deterministic<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("sum_squares_matches_and_is_deterministic", "placeholder");
    let _ = h;
}
pub fn sum_squares_many_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("sum_squares_many_matches_composition", "placeholder");
    let _ = h;
}
pub fn adamw_clipped_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("adamw_clipped_matches_composition", "placeholder");
    let _ = h;
}
pub fn adamw_clipped_fp8_matches_composition<D: duet_device::Device>(h: &super::Harness<D>) {
    super::skip("adamw_clipped_fp8_matches_composition", "placeholder");
    let _ = h;
}
