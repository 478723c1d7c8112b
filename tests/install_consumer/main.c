/* Out-of-tree consumer of an installed qpack: only <qpack/qpack.h> and the
 * library, found through find_package(qpack) or pkg-config. An int8 linear on
 * QNNPACK (in every build), checked against a float reference within 1 quantum,
 * then saved to a model file and loaded back (mapped): same outputs, byte for byte. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <qpack/qpack.h>

enum { K = 19, N = 7, M = 3 };

int main(void) {
  char line[256];
  if (qpack_build_info_string(line, sizeof(line)) != QPACK_STATUS_SUCCESS) return 1;
  printf("%s\n", line);

  int8_t w[N * K];
  float scales[N], bias[N];
  uint8_t x[M * K], y[M * N];
  for (int i = 0; i < N * K; ++i) w[i] = (int8_t)((i * 29) % 255 - 127);
  for (int n = 0; n < N; ++n) {
    scales[n] = 0.003f * (float)(n + 1);
    bias[n] = 0.25f * (float)n - 1.0f;
  }
  for (int i = 0; i < M * K; ++i) x[i] = (uint8_t)((i * 41) % 256);
  const float in_scale = 0.05f, out_scale = 0.2f;
  const int in_zp = 120, out_zp = 128;

  qpack_linear_params p;
  qpack_linear_params_init(&p);
  p.in_features = K;
  p.out_features = N;
  p.mode = QPACK_MODE_INT8_STATIC;
  p.backend = QPACK_BACKEND_QNNPACK;
  p.weight = w;
  p.weight_scales = scales;
  p.num_weight_scales = N;
  p.bias = bias;
  p.output_scale = out_scale;
  p.output_zero_point = out_zp;
  p.retain = QPACK_RETAIN_RELEASE;
  qpack_linear* lin = NULL;
  if (qpack_linear_create(&p, &lin) != QPACK_STATUS_SUCCESS ||
      qpack_linear_run_u8(lin, M, x, in_scale, in_zp, y) != QPACK_STATUS_SUCCESS) {
    fprintf(stderr, "qpack: %s\n", qpack_last_error());
    qpack_linear_destroy(lin);
    return 1;
  }
  int worst = 0;
  for (int m = 0; m < M; ++m) {
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k) acc += (double)(x[m * K + k] - in_zp) * w[n * K + k];
      double q = nearbyint((acc * in_scale * scales[n] + bias[n]) / out_scale) + out_zp;
      q = q < 0 ? 0 : q > 255 ? 255 : q;
      int d = abs((int)q - (int)y[m * N + n]);
      if (d > worst) worst = d;
    }
  }
  int8_t w2[N * K];
  int exact = qpack_linear_unpack(lin, w2, NULL) == QPACK_STATUS_SUCCESS &&
              memcmp(w, w2, sizeof(w)) == 0;

  /* A model file: save, load (mapped), run again. */
  char path[] = "/tmp/qpack-install-consumer-XXXXXX";
  int fd = mkstemp(path);
  if (fd >= 0) close(fd);
  qpack_linear* loaded = NULL;
  uint8_t y2[M * N];
  const int file_ok = fd >= 0 && qpack_linear_save(lin, path) == QPACK_STATUS_SUCCESS &&
                      qpack_linear_load(path, NULL, &loaded) == QPACK_STATUS_SUCCESS &&
                      qpack_linear_run_u8(loaded, M, x, in_scale, in_zp, y2) == QPACK_STATUS_SUCCESS &&
                      memcmp(y, y2, sizeof(y)) == 0;
  if (!file_ok) fprintf(stderr, "model file: %s\n", qpack_last_error());
  if (fd >= 0) unlink(path);
  qpack_linear_destroy(loaded);
  qpack_linear_destroy(lin);
  printf("install consumer: max diff %d quanta vs float reference, unpack %s, model file %s\n",
         worst, exact ? "bit-exact" : "DIFFERS", file_ok ? "round trip equal" : "FAILED");
  return worst <= 1 && exact && file_ok ? 0 : 1;
}
