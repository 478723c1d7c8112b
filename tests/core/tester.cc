#include "core/tester.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <vector>

namespace qpack_test {
namespace {

int g_failures = 0, g_checks = 0;

void expect(bool ok, const std::string& what, const std::string& where) {
  ++g_checks;
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "FAIL [%s]: %s (last error: %s)\n", where.c_str(), what.c_str(),
               qpack_last_error());
}

struct Rng {
  uint32_t s;
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    return s;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * (next() % 1000001) / 1000000.0f; }
  int8_t int8() { return static_cast<int8_t>(static_cast<int32_t>(next() % 255) - 127); }
  uint8_t uint8() { return static_cast<uint8_t>(next() % 256); }
};

// The op's weights, bias and quantization, generated for a tester's settings.
struct Weights {
  std::vector<float> wf;       // f32 weights
  std::vector<int8_t> wq;      // int8 weights
  std::vector<float> scales;   // int8: 1 or one per output channel
  std::vector<float> bias;
  const void* data() const { return wq.empty() ? static_cast<const void*>(wf.data()) : wq.data(); }
  size_t nbytes() const { return wq.empty() ? wf.size() * 4 : wq.size(); }
  float real(size_t i, int64_t channel) const {
    if (wq.empty()) return wf[i];
    return wq[i] * scales[scales.size() > 1 ? channel : 0];
  }
};

Weights make_weights(Rng& rng, qpack_mode mode, int64_t count, int64_t channels, bool per_channel,
                     bool with_bias) {
  Weights w;
  if (mode == QPACK_MODE_F32) {
    w.wf.resize(count);
    for (auto& v : w.wf) v = rng.uniform(-1, 1);
  } else {
    w.wq.resize(count);
    for (auto& v : w.wq) v = rng.int8();
    w.scales.resize(per_channel ? channels : 1);
    for (size_t n = 0; n < w.scales.size(); ++n) w.scales[n] = 0.002f + 0.0001f * n;
  }
  if (with_bias) {
    w.bias.resize(channels);
    for (auto& b : w.bias) b = rng.uniform(-0.5f, 0.5f);
  }
  return w;
}

// Output parameters that cover the reference outputs' range.
void choose_output(const std::vector<double>& ref, float* scale, int32_t* zp) {
  double lo = 0, hi = 0;
  for (double v : ref) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  *scale = static_cast<float>(std::max(hi - lo, 1e-3) / 255.0);
  *zp = static_cast<int32_t>(std::lround(-lo / *scale));
  *zp = std::min(255, std::max(0, *zp));
}

uint8_t quantize(double v, float scale, int32_t zp) {
  const double q = std::nearbyint(v / scale) + zp;
  return static_cast<uint8_t>(std::min(255.0, std::max(0.0, q)));
}

// The inputs of one run and their real values.
struct Input {
  std::vector<float> xf;
  std::vector<uint8_t> xq;
  float scale = 0.02f;
  int32_t zp = 128;
  float real(size_t i) const { return xq.empty() ? xf[i] : (xq[i] - zp) * scale; }
};

Input make_input(Rng& rng, qpack_mode mode, int64_t count) {
  Input in;
  if (mode == QPACK_MODE_INT8_STATIC) {
    in.xq.resize(count);
    for (auto& v : in.xq) v = rng.uint8();
  } else {
    in.xf.resize(count);
    for (auto& v : in.xf) v = rng.uniform(-2, 2);
  }
  return in;
}

// Compares y with ref (real values, the fused clamp not applied yet), each
// output's tolerance from `tolerance(i)`; static int8 compares uint8 within 1.
template <typename Tol>
void compare(const char* what, const std::string& where, qpack_mode mode,
             const std::vector<double>& ref, const std::vector<float>& yf,
             const std::vector<uint8_t>& yq, float out_scale, int32_t out_zp, const Tol& tolerance) {
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    double err;
    if (mode == QPACK_MODE_INT8_STATIC) {
      err = std::abs(static_cast<int>(yq[i]) - quantize(ref[i], out_scale, out_zp)) / 1.0;
      err = err > 1 ? err : 0;  // within one quantum
    } else {
      err = std::abs(yf[i] - ref[i]) > tolerance(i) ? std::abs(yf[i] - ref[i]) : 0;
    }
    if (err > worst) {
      worst = err;
      at = i;
    }
  }
  std::ostringstream os;
  os << what << ": output " << at << " off by " << worst;
  expect(worst == 0, os.str(), where);
}

// The params fields every op shares, from a tester's settings.
template <typename Params>
void fill_common(Params* p, qpack_mode mode, qpack_backend backend, const Weights& w,
                 float clamp_min, float clamp_max, const std::vector<double>& ref) {
  p->mode = mode;
  p->backend = backend;
  p->retain = QPACK_RETAIN_KEEP;
  p->weight = w.data();
  p->weight_scales = w.scales.empty() ? nullptr : w.scales.data();
  p->num_weight_scales = static_cast<int64_t>(w.scales.size());
  p->bias = w.bias.empty() ? nullptr : w.bias.data();
  p->clamp_min = clamp_min;
  p->clamp_max = clamp_max;
  if (mode == QPACK_MODE_INT8_STATIC) choose_output(ref, &p->output_scale, &p->output_zero_point);
}

// What every op shares after its runs: release, unpack bit-exact, counters, close.
template <typename Handle, typename Info>
void check_lifetime(Handle* h, const Weights& w, uint64_t runs, const std::string& where,
                    qpack_status (*release)(Handle*),
                    qpack_status (*unpack)(const Handle*, void*, float*),
                    qpack_status (*info)(const Handle*, Info*),
                    qpack_status (*stats)(const Handle*, qpack_op_stats*),
                    qpack_status (*close)(Handle*)) {
  expect(release(h) == QPACK_STATUS_SUCCESS, "release_original", where);
  std::vector<uint8_t> back(w.nbytes());
  std::vector<float> bias(std::max<size_t>(w.bias.size(), 1));
  expect(unpack(h, back.data(), w.bias.empty() ? nullptr : bias.data()) == QPACK_STATUS_SUCCESS,
         "unpack after release", where);
  expect(std::memcmp(back.data(), w.data(), back.size()) == 0, "unpack bit-exact after release",
         where);
  expect(w.bias.empty() || std::memcmp(bias.data(), w.bias.data(), w.bias.size() * 4) == 0,
         "bias bit-exact", where);
  Info i{};
  expect(info(h, &i) == QPACK_STATUS_SUCCESS && i.has_original == 0 && i.nbytes_original == 0 &&
             i.nbytes_packed > 0 && i.closed == 0,
         "info after release", where);
  qpack_op_stats s{};
  expect(stats(h, &s) == QPACK_STATUS_SUCCESS && s.runs == runs && s.states_built >= 1 &&
             s.cache_hits <= s.runs,
         "stats count the runs", where);
  expect(close(h) == QPACK_STATUS_SUCCESS, "close", where);
  expect(info(h, &i) == QPACK_STATUS_SUCCESS && i.closed == 1 && i.nbytes_packed == 0,
         "info says closed", where);
  expect(unpack(h, back.data(), nullptr) == QPACK_STATUS_CLOSED, "unpack after close", where);
}

}  // namespace

int failures() { return g_failures; }
int checks() { return g_checks; }

bool supports(qpack_backend backend, int op, qpack_mode mode) {
  for (int i = 0; i < qpack_backend_count(); ++i) {
    qpack_backend_info b;
    if (qpack_backend_get_info(i, &b) != QPACK_STATUS_SUCCESS || b.backend != backend) continue;
    const unsigned modes = op == 0 ? b.linear_modes : b.conv2d_modes;
    return b.available && (modes & (1u << mode));
  }
  return false;
}

template <typename Self>
std::string OpTester<Self>::describe_common() const {
  std::ostringstream os;
  os << "mode=" << mode_ << " backend=" << backend_ << " clamp=[" << clamp_min_ << ","
     << clamp_max_ << "] per_channel=" << per_channel_ << " bias=" << bias_;
  return os.str();
}

// ---- linear --------------------------------------------------------------------

void LinearTester::Test() const {
  std::ostringstream os;
  os << "linear M=" << M_ << " K=" << K_ << " N=" << N_ << " " << describe_common();
  const std::string where = os.str();
  Rng rng{seed_ * 2654435761u + 1};
  const Weights w = make_weights(rng, mode_, N_ * K_, N_, per_channel_, bias_);
  const Input in = make_input(rng, mode_, M_ * K_);

  // Reference in double, clamp applied after.
  std::vector<double> ref(static_cast<size_t>(M_ * N_));
  std::vector<double> tol(ref.size(), 0);
  float xmin = 0, xmax = 0;
  for (float v : in.xf) {
    xmin = std::min(xmin, v);
    xmax = std::max(xmax, v);
  }
  const double dyn_step = (static_cast<double>(xmax) - xmin) / 255.0;  // dynamic input quantum
  for (int64_t m = 0; m < M_; ++m) {
    for (int64_t n = 0; n < N_; ++n) {
      double acc = w.bias.empty() ? 0 : w.bias[n], mag_w = 0, mag_xw = 0;
      for (int64_t k = 0; k < K_; ++k) {
        const double wr = w.real(n * K_ + k, n), xr = in.real(m * K_ + k);
        acc += xr * wr;
        mag_w += std::abs(wr);
        mag_xw += std::abs(xr * wr);
      }
      ref[m * N_ + n] = std::min<double>(std::max<double>(acc, clamp_min_), clamp_max_);
      // Dynamic int8 rounds each input to its quantum: at most half of it per term.
      tol[m * N_ + n] = 1e-4 * (mag_xw + 1) +
                        (mode_ == QPACK_MODE_INT8_DYNAMIC ? dyn_step * 0.5 * mag_w : 0.0);
    }
  }

  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = K_;
  p.out_features = N_;
  fill_common(&p, mode_, backend_, w, clamp_min_, clamp_max_, ref);
  qpack_linear* h = nullptr;
  expect(qpack_linear_create(&p, &h) == QPACK_STATUS_SUCCESS, "create", where);
  if (h == nullptr) return;

  std::vector<float> yf(ref.size());
  std::vector<uint8_t> yq(ref.size());
  const qpack_status st =
      mode_ == QPACK_MODE_INT8_STATIC
          ? qpack_linear_run_u8(h, M_, in.xq.data(), in.scale, in.zp, yq.data())
          : qpack_linear_run_f32(h, M_, in.xf.data(), yf.data());
  expect(st == QPACK_STATUS_SUCCESS, "run", where);
  compare("run", where, mode_, ref, yf, yq, p.output_scale, p.output_zero_point,
          [&](size_t i) { return tol[i]; });
  check_lifetime(h, w, 1, where, qpack_linear_release_original, qpack_linear_unpack,
                 qpack_linear_get_info, qpack_linear_get_stats, qpack_linear_close);
  qpack_linear_destroy(h);
}

// ---- conv2d -----------------------------------------------------------------------

void ConvTester::Test() const {
  std::ostringstream os;
  os << "conv2d N=" << N_ << " " << IC_ << "->" << OC_ << " g=" << G_ << " k=" << KH_ << "x"
     << KW_ << " s=" << S_ << " p=" << P_ << " d=" << D_ << " in=" << H_ << "x" << W_
     << " layouts=" << xl_ << "/" << yl_ << " " << describe_common();
  const std::string where = os.str();
  Rng rng{seed_ * 2246822519u + 7};
  const int64_t icg = IC_ / G_, ocg = OC_ / G_;
  const Weights w = make_weights(rng, mode_, OC_ * icg * KH_ * KW_, OC_, per_channel_, bias_);
  const Input in = make_input(rng, mode_, N_ * IC_ * H_ * W_);
  const int64_t OH = (H_ + 2 * P_ - D_ * (KH_ - 1) - 1) / S_ + 1;
  const int64_t OW = (W_ + 2 * P_ - D_ * (KW_ - 1) - 1) / S_ + 1;
  // Element offsets of the logical [n, c, h, w] in a layout.
  auto at = [](qpack_layout l, int64_t C, int64_t Hh, int64_t Ww, int64_t n, int64_t c,
               int64_t h, int64_t x) {
    return l == QPACK_LAYOUT_NCHW ? ((n * C + c) * Hh + h) * Ww + x : ((n * Hh + h) * Ww + x) * C + c;
  };

  std::vector<double> ref(static_cast<size_t>(N_ * OC_ * OH * OW));
  std::vector<double> tol(ref.size(), 0);
  for (int64_t n = 0; n < N_; ++n) {
    for (int64_t o = 0; o < OC_; ++o) {
      const int64_t g = o / ocg;
      for (int64_t oh = 0; oh < OH; ++oh) {
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = w.bias.empty() ? 0 : w.bias[o], mag = 0;
          for (int64_t c = 0; c < icg; ++c) {
            for (int64_t ky = 0; ky < KH_; ++ky) {
              for (int64_t kx = 0; kx < KW_; ++kx) {
                const int64_t ih = oh * S_ - P_ + ky * D_, iw = ow * S_ - P_ + kx * D_;
                if (ih < 0 || ih >= H_ || iw < 0 || iw >= W_) continue;
                const double wr = w.real(((o * icg + c) * KH_ + ky) * KW_ + kx, o);
                const double xr = in.real(at(xl_, IC_, H_, W_, n, g * icg + c, ih, iw));
                acc += xr * wr;
                mag += std::abs(xr * wr);
              }
            }
          }
          const size_t i = at(yl_, OC_, OH, OW, n, o, oh, ow);
          ref[i] = std::min<double>(std::max<double>(acc, clamp_min_), clamp_max_);
          tol[i] = 1e-4 * (mag + 1);
        }
      }
    }
  }

  qpack_conv2d_params p;
  qpack_conv2d_params_init(&p);
  p.in_channels = IC_;
  p.out_channels = OC_;
  p.groups = G_;
  p.kernel_h = KH_;
  p.kernel_w = KW_;
  p.stride_h = p.stride_w = S_;
  p.pad_top = p.pad_left = p.pad_bottom = p.pad_right = P_;
  p.dilation_h = p.dilation_w = D_;
  fill_common(&p, mode_, backend_, w, clamp_min_, clamp_max_, ref);
  qpack_conv2d* h = nullptr;
  expect(qpack_conv2d_create(&p, &h) == QPACK_STATUS_SUCCESS, "create", where);
  if (h == nullptr) return;

  std::vector<float> yf(ref.size());
  std::vector<uint8_t> yq(ref.size());
  const qpack_status st =
      mode_ == QPACK_MODE_INT8_STATIC
          ? qpack_conv2d_run_u8(h, N_, H_, W_, xl_, in.xq.data(), in.scale, in.zp, yl_, yq.data())
          : qpack_conv2d_run_f32(h, N_, H_, W_, xl_, in.xf.data(), yl_, yf.data());
  expect(st == QPACK_STATUS_SUCCESS, "run", where);
  compare("run", where, mode_, ref, yf, yq, p.output_scale, p.output_zero_point,
          [&](size_t i) { return tol[i]; });
  check_lifetime(h, w, 1, where, qpack_conv2d_release_original, qpack_conv2d_unpack,
                 qpack_conv2d_get_info, qpack_conv2d_get_stats, qpack_conv2d_close);
  qpack_conv2d_destroy(h);
}

template class OpTester<LinearTester>;
template class OpTester<ConvTester>;

}  // namespace qpack_test
