// aarch64 smoke test of PyTorch's QNNPACK, run under qemu-user by ctest:
//   qnnpack_smoke cpuinfo   cpuinfo initialises; what it sees of the (emulated) CPU
//   qnnpack_smoke init      pytorch_qnnp_initialize() succeeds; the q8 GEMM/conv
//                           micro-kernels it selected (mr/nr/kr, function identity)
//   qnnpack_smoke fc        q8 fully-connected through the public API vs a plain
//                           C++ reference: exact, or within 1 quantum
#include <cpuinfo.h>
#include <pthreadpool.h>
#include <pytorch_qnnpack.h>
#include <qnnpack/params.h>
#include <qnnpack/q8conv.h>
#include <qnnpack/q8gemm.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "FAIL: %s\n", what);
  return 1;
}

int test_cpuinfo() {
  if (!cpuinfo_initialize()) return fail("cpuinfo_initialize() returned false");
  const cpuinfo_core* core0 = cpuinfo_get_core(0);
  std::printf("cpuinfo: processors=%u cores=%u clusters=%u packages=%u\n",
              cpuinfo_get_processors_count(), cpuinfo_get_cores_count(),
              cpuinfo_get_clusters_count(), cpuinfo_get_packages_count());
  std::printf("cpuinfo: package0 name='%s' core0 vendor=%d uarch=0x%x\n",
              cpuinfo_get_package(0)->name, (int)core0->vendor, (unsigned)core0->uarch);
#if CPUINFO_ARCH_ARM64
  std::printf("cpuinfo: core0 midr=0x%08x (0: no MIDR in /proc/cpuinfo or sysfs)\n",
              (unsigned)core0->midr);
  std::printf("cpuinfo: arm64 neon=%d neon_fp16_arith=%d neon_dot=%d atomics=%d\n",
              (int)cpuinfo_has_arm_neon(), (int)cpuinfo_has_arm_neon_fp16_arith(),
              (int)cpuinfo_has_arm_neon_dot(), (int)cpuinfo_has_arm_atomics());
  if (!cpuinfo_has_arm_neon()) return fail("cpuinfo reports no NEON on aarch64");
#else
  std::printf("cpuinfo: not an arm64 build (CPUINFO_ARCH_ARM64=0)\n");
#endif
  cpuinfo_deinitialize();
  std::printf("PASS cpuinfo\n");
  return 0;
}

int test_init() {
  const pytorch_qnnp_status st = pytorch_qnnp_initialize();
  if (st != pytorch_qnnp_status_success) {
    std::fprintf(stderr, "pytorch_qnnp_initialize() = %d\n", (int)st);
    return fail("pytorch_qnnp_initialize");
  }
  const auto& p = pytorch_qnnp_params;
  std::printf("qnnpack: initialized=%d q8conv mr=%u nr=%u kr=%u\n", (int)p.initialized,
              (unsigned)p.q8conv.mr, (unsigned)p.q8conv.nr, (unsigned)p.q8conv.kr);
  std::printf("qnnpack: sparse c1x4 mr=%u nr=%u kr=%u; dw9 cr=%u; dw25 cr=%u\n",
              (unsigned)p.q8gemm_sparse_c1x4.mr, (unsigned)p.q8gemm_sparse_c1x4.nr,
              (unsigned)p.q8gemm_sparse_c1x4.kr, (unsigned)p.q8dw9.cr, (unsigned)p.q8dw25.cr);
#if CPUINFO_ARCH_ARM64
  const bool gemm = p.q8conv.gemm == pytorch_q8gemm_ukernel_8x8__aarch64_neon;
  const bool conv = p.q8conv.conv == pytorch_q8conv_ukernel_8x8__aarch64_neon;
  const bool dq = p.q8conv.gemm_dq == pytorch_q8gemm_dq_ukernel_8x8__aarch64_neon;
  std::printf("qnnpack: q8conv.gemm is pytorch_q8gemm_ukernel_8x8__aarch64_neon: %s\n",
              gemm ? "yes" : "no");
  std::printf("qnnpack: q8conv.conv is pytorch_q8conv_ukernel_8x8__aarch64_neon: %s\n",
              conv ? "yes" : "no");
  std::printf("qnnpack: q8conv.gemm_dq is pytorch_q8gemm_dq_ukernel_8x8__aarch64_neon: %s\n",
              dq ? "yes" : "no");
  if (p.q8conv.mr != 8 || p.q8conv.nr != 8 || p.q8conv.kr != 1)
    return fail("expected the aarch64 8x8 (kr 1) q8 GEMM");
  if (!gemm || !conv || !dq) return fail("aarch64 assembly kernels not selected");
#endif
  pytorch_qnnp_deinitialize();
  std::printf("PASS init\n");
  return 0;
}

// QNNPACK's requantization (NEON): float(acc) * scale, clamped to
// [qmin - zp, qmax - zp], rounded to nearest-even (magic-number add), plus zp.
uint8_t requantize_ref(int32_t acc, float scale, uint8_t zp, uint8_t qmin, uint8_t qmax) {
  const float x = static_cast<float>(acc) * scale;
  const long r = std::lrint(x) + zp;  // default rounding mode: nearest-even
  return static_cast<uint8_t>(std::min<long>(qmax, std::max<long>(qmin, r)));
}

struct FcCase { size_t batch, k, n; bool per_channel; uint8_t qmin, qmax; };

// FNV-1a over every output, printed so that builds for two architectures can be
// compared on identical inputs (same seed, same libstdc++ distributions).
uint64_t g_hash = 1469598103934665603ull;

int run_fc(const FcCase& c, pthreadpool_t pool, std::mt19937& rng, int* max_diff_out,
           size_t* mismatches_out, size_t* clamped_out) {
  std::uniform_int_distribution<int> bias_d(-2000, 2000);
  std::uniform_int_distribution<int> mid(100, 155), out_zp_d(64, 192), delta(-100, 100);
  const uint8_t in_zp = static_cast<uint8_t>(mid(rng));
  const uint8_t out_zp = static_cast<uint8_t>(out_zp_d(rng));
  // Output scale grows with sqrt(K) so that most outputs land inside [qmin, qmax].
  const float in_scale = 0.05f, out_scale = 0.025f * std::sqrt(static_cast<float>(c.k));
  // kernel zero points and requantization scales: QNNPACK keeps pointers to them and
  // its NEON kernels read 8 lanes at a time, so pad to a multiple of 8 (+8).
  const size_t n_pad = ((c.n + 7) / 8) * 8 + 8;
  std::vector<uint8_t> w_zp(n_pad);
  std::vector<float> w_scale(n_pad), req(n_pad);
  for (size_t j = 0; j < n_pad; j++) {
    const size_t jj = std::min(j, c.n - 1);
    w_zp[j] = c.per_channel ? static_cast<uint8_t>(100 + (jj * 7) % 56) : 128;
    w_scale[j] = c.per_channel ? 0.002f + 0.0005f * static_cast<float>(jj % 9) : 0.003f;
    req[j] = in_scale * w_scale[j] / out_scale;
  }
  std::vector<uint8_t> w(c.n * c.k), x(c.batch * c.k), y(c.batch * c.n, 0xA5);
  std::vector<int32_t> b(c.n);
  // Values spread around their zero points (as real quantized data are), so that
  // most outputs fall inside the clamp range rather than saturating.
  for (size_t j = 0; j < c.n; j++)
    for (size_t kk = 0; kk < c.k; kk++) w[j * c.k + kk] = static_cast<uint8_t>(w_zp[j] + delta(rng));
  for (auto& v : x) v = static_cast<uint8_t>(in_zp + delta(rng));
  for (auto& v : b) v = bias_d(rng);

  pytorch_qnnp_operator_t op = nullptr;
  if (pytorch_qnnp_create_fully_connected_nc_q8(c.k, c.n, in_zp, w_zp.data(), w.data(), b.data(),
                                                out_zp, c.qmin, c.qmax, 0, req.data(), &op) !=
      pytorch_qnnp_status_success)
    return fail("pytorch_qnnp_create_fully_connected_nc_q8");
  if (pytorch_qnnp_setup_fully_connected_nc_q8(op, c.batch, x.data(), c.k, y.data(), c.n) !=
      pytorch_qnnp_status_success)
    return fail("pytorch_qnnp_setup_fully_connected_nc_q8");
  if (pytorch_qnnp_run_operator(op, pool) != pytorch_qnnp_status_success)
    return fail("pytorch_qnnp_run_operator");
  pytorch_qnnp_delete_operator(op);
  for (uint8_t v : y) g_hash = (g_hash ^ v) * 1099511628211ull;

  int max_diff = 0;
  size_t mismatches = 0, clamped = 0;
  for (size_t i = 0; i < c.batch; i++) {
    for (size_t j = 0; j < c.n; j++) {
      int32_t acc = b[j];
      for (size_t kk = 0; kk < c.k; kk++)
        acc += (int32_t(x[i * c.k + kk]) - in_zp) * (int32_t(w[j * c.k + kk]) - w_zp[j]);
      const int ref = requantize_ref(acc, req[j], out_zp, c.qmin, c.qmax);
      const int d = std::abs(ref - int(y[i * c.n + j]));
      if (ref == c.qmin || ref == c.qmax) clamped++;
      if (d != 0) mismatches++;
      max_diff = std::max(max_diff, d);
    }
  }
  *max_diff_out = max_diff;
  *mismatches_out = mismatches;
  *clamped_out = clamped;
  return 0;
}

int test_fc() {
  if (pytorch_qnnp_initialize() != pytorch_qnnp_status_success)
    return fail("pytorch_qnnp_initialize");
  pthreadpool_t pool = pthreadpool_create(2);
  if (!pool) return fail("pthreadpool_create(2)");
  const FcCase cases[] = {
      {1, 1, 1, false, 0, 255},    {1, 16, 8, false, 0, 255},  {5, 37, 13, false, 0, 255},
      {8, 64, 64, false, 0, 255},  {13, 100, 33, true, 0, 255}, {1, 512, 512, true, 0, 255},
      {32, 256, 96, true, 0, 255}, {9, 77, 40, true, 20, 200},  {16, 1024, 17, false, 0, 255},
  };
  std::mt19937 rng(20250611);
  int worst = 0;
  size_t total = 0, total_mismatch = 0;
  for (const auto& c : cases) {
    for (pthreadpool_t tp : {pthreadpool_t(nullptr), pool}) {
      int d = 0;
      size_t mm = 0, cl = 0;
      if (run_fc(c, tp, rng, &d, &mm, &cl)) return 1;
      std::printf("fc batch=%-3zu K=%-5zu N=%-4zu %s clamp=[%u,%u] threads=%s: max |diff| %d, "
                  "%zu of %zu outputs differ (%zu at a clamp bound)\n",
                  c.batch, c.k, c.n, c.per_channel ? "per-channel" : "per-tensor ",
                  (unsigned)c.qmin, (unsigned)c.qmax, tp ? "2" : "caller", d, mm, c.batch * c.n,
                  cl);
      worst = std::max(worst, d);
      total += c.batch * c.n;
      total_mismatch += mm;
    }
  }
  pthreadpool_destroy(pool);
  std::printf("fc: %zu outputs, %zu differ from the reference, worst |diff| %d quantum, "
              "output hash %016llx\n",
              total, total_mismatch, worst, (unsigned long long)g_hash);
  if (worst > 1) return fail("fully-connected differs from the reference by more than 1 quantum");
  std::printf("PASS fc\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines survive a ctest timeout
  const char* what = argc > 1 ? argv[1] : "";
  if (!std::strcmp(what, "cpuinfo")) return test_cpuinfo();
  if (!std::strcmp(what, "init")) return test_init();
  if (!std::strcmp(what, "fc")) return test_fc();
  std::fprintf(stderr, "usage: %s cpuinfo|init|fc\n", argv[0]);
  return 2;
}
