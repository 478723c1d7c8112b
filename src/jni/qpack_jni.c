/* JNI binding of qpack's C API for org.qpack.PackedLinear (src/jni/java): a
 * static int8 linear layer (int8 weights, uint8 activations) on the build's
 * int8 backend (QNNPACK on ARM and Android). Only qpack.h is used.
 *
 * Errors: a failed qpack call throws, with qpack_last_error() as the message:
 * IllegalArgumentException (bad argument or dtype), IllegalStateException
 * (closed), UnsupportedOperationException, OutOfMemoryError, java.io.IOException
 * (a model file that cannot be read or written, or is corrupt), or
 * org.qpack.QpackException (backend or internal error). */
#include <jni.h>
#include <stdint.h>
#include <stdlib.h>

#include "qpack/qpack.h"

static void throw_status(JNIEnv* env, qpack_status status) {
  const char* cls;
  switch (status) {
    case QPACK_STATUS_INVALID_ARGUMENT:
    case QPACK_STATUS_INVALID_TYPE: cls = "java/lang/IllegalArgumentException"; break;
    case QPACK_STATUS_CLOSED: cls = "java/lang/IllegalStateException"; break;
    case QPACK_STATUS_UNSUPPORTED: cls = "java/lang/UnsupportedOperationException"; break;
    case QPACK_STATUS_OUT_OF_MEMORY: cls = "java/lang/OutOfMemoryError"; break;
    case QPACK_STATUS_FILE_FORMAT:
    case QPACK_STATUS_IO: cls = "java/io/IOException"; break;
    default: cls = "org/qpack/QpackException"; break;
  }
  jclass c = (*env)->FindClass(env, cls);
  if (c != NULL) (*env)->ThrowNew(env, c, qpack_last_error());
}

static int ok(JNIEnv* env, qpack_status status) {
  if (status == QPACK_STATUS_SUCCESS) return 1;
  throw_status(env, status);
  return 0;
}

static void throw_arg(JNIEnv* env, const char* message) {
  jclass c = (*env)->FindClass(env, "java/lang/IllegalArgumentException");
  if (c != NULL) (*env)->ThrowNew(env, c, message);
}

JNIEXPORT jstring JNICALL Java_org_qpack_PackedLinear_nativeBuildInfo(JNIEnv* env, jclass cls) {
  (void)cls;
  char buf[256];
  if (!ok(env, qpack_build_info_string(buf, sizeof(buf)))) return NULL;
  return (*env)->NewStringUTF(env, buf);
}

JNIEXPORT jlong JNICALL Java_org_qpack_PackedLinear_nativeCreate(
    JNIEnv* env, jclass cls, jbyteArray weight, jint out_features, jint in_features,
    jfloatArray weight_scales, jfloatArray bias, jfloat output_scale, jint output_zero_point,
    jboolean retain) {
  (void)cls;
  if (weight == NULL || weight_scales == NULL) {
    throw_arg(env, "weight and weightScales must not be null");
    return 0;
  }
  if (out_features < 1 || in_features < 1 ||
      (*env)->GetArrayLength(env, weight) != (jsize)((int64_t)out_features * in_features)) {
    throw_arg(env, "weight must hold outFeatures * inFeatures int8 values (row-major [N, K])");
    return 0;
  }
  const jsize num_scales = (*env)->GetArrayLength(env, weight_scales);
  if (bias != NULL && (*env)->GetArrayLength(env, bias) != out_features) {
    throw_arg(env, "bias must be null or hold outFeatures values");
    return 0;
  }
  jbyte* w = (*env)->GetByteArrayElements(env, weight, NULL);
  jfloat* s = (*env)->GetFloatArrayElements(env, weight_scales, NULL);
  jfloat* b = bias != NULL ? (*env)->GetFloatArrayElements(env, bias, NULL) : NULL;
  qpack_linear* lin = NULL;
  if (w != NULL && s != NULL && (bias == NULL || b != NULL)) {
    qpack_linear_params p;
    qpack_linear_params_init(&p);
    p.in_features = in_features;
    p.out_features = out_features;
    p.mode = QPACK_MODE_INT8_STATIC;
    p.retain = retain ? QPACK_RETAIN_KEEP : QPACK_RETAIN_RELEASE;
    p.weight = w;
    p.weight_scales = s;
    p.num_weight_scales = num_scales;
    p.bias = b;
    p.output_scale = output_scale;
    p.output_zero_point = output_zero_point;
    ok(env, qpack_linear_create(&p, &lin)); /* copies what it needs */
  }
  if (b != NULL) (*env)->ReleaseFloatArrayElements(env, bias, b, JNI_ABORT);
  if (s != NULL) (*env)->ReleaseFloatArrayElements(env, weight_scales, s, JNI_ABORT);
  if (w != NULL) (*env)->ReleaseByteArrayElements(env, weight, w, JNI_ABORT);
  return (jlong)(intptr_t)lin;
}

JNIEXPORT jbyteArray JNICALL Java_org_qpack_PackedLinear_nativeRun(
    JNIEnv* env, jclass cls, jlong handle, jbyteArray input, jint batch, jfloat input_scale,
    jint input_zero_point) {
  (void)cls;
  const qpack_linear* lin = (const qpack_linear*)(intptr_t)handle;
  qpack_linear_info info;
  if (!ok(env, qpack_linear_get_info(lin, &info))) return NULL;  /* also after close */
  if (input == NULL || batch < 0 ||
      (*env)->GetArrayLength(env, input) != (jsize)((int64_t)batch * info.in_features)) {
    throw_arg(env, "input must hold batch * inFeatures uint8 values");
    return NULL;
  }
  const jsize n_out = (jsize)((int64_t)batch * info.out_features);
  jbyteArray out = (*env)->NewByteArray(env, n_out);
  if (out == NULL) return NULL;
  uint8_t* y = (uint8_t*)malloc(n_out > 0 ? (size_t)n_out : 1u);
  if (y == NULL) {
    throw_status(env, QPACK_STATUS_OUT_OF_MEMORY);
    return NULL;
  }
  /* A copy, not a pinned array: the run may take long and use several threads. */
  jbyte* x = (*env)->GetByteArrayElements(env, input, NULL);
  int success = 0;
  if (x != NULL) {
    success = ok(env, qpack_linear_run_u8(lin, batch, (const uint8_t*)x, input_scale,
                                          input_zero_point, y));
    (*env)->ReleaseByteArrayElements(env, input, x, JNI_ABORT);
  }
  if (success) (*env)->SetByteArrayRegion(env, out, 0, n_out, (const jbyte*)y);
  free(y);
  return success ? out : NULL;
}

JNIEXPORT jbyteArray JNICALL Java_org_qpack_PackedLinear_nativeUnpack(JNIEnv* env, jclass cls,
                                                                     jlong handle) {
  (void)cls;
  const qpack_linear* lin = (const qpack_linear*)(intptr_t)handle;
  qpack_linear_info info;
  if (!ok(env, qpack_linear_get_info(lin, &info))) return NULL;
  const jsize n = (jsize)(info.in_features * info.out_features);
  int8_t* w = (int8_t*)malloc((size_t)n);
  if (w == NULL) {
    throw_status(env, QPACK_STATUS_OUT_OF_MEMORY);
    return NULL;
  }
  jbyteArray out = NULL;
  if (ok(env, qpack_linear_unpack(lin, w, NULL))) {
    out = (*env)->NewByteArray(env, n);
    if (out != NULL) (*env)->SetByteArrayRegion(env, out, 0, n, (const jbyte*)w);
  }
  free(w);
  return out;
}

JNIEXPORT jboolean JNICALL Java_org_qpack_PackedLinear_nativeHasOriginal(JNIEnv* env, jclass cls,
                                                                        jlong handle) {
  (void)cls;
  qpack_linear_info info;
  if (!ok(env, qpack_linear_get_info((const qpack_linear*)(intptr_t)handle, &info))) return 0;
  return info.has_original ? JNI_TRUE : JNI_FALSE;
}

JNIEXPORT void JNICALL Java_org_qpack_PackedLinear_nativeClose(JNIEnv* env, jclass cls,
                                                              jlong handle) {
  (void)cls;
  ok(env, qpack_linear_close((qpack_linear*)(intptr_t)handle));
}

JNIEXPORT void JNICALL Java_org_qpack_PackedLinear_nativeDestroy(JNIEnv* env, jclass cls,
                                                                jlong handle) {
  (void)env, (void)cls;
  qpack_linear_destroy((qpack_linear*)(intptr_t)handle);
}

JNIEXPORT void JNICALL Java_org_qpack_PackedLinear_nativeSave(JNIEnv* env, jclass cls,
                                                             jlong handle, jstring path) {
  (void)cls;
  if (path == NULL) {
    throw_arg(env, "path must not be null");
    return;
  }
  const char* p = (*env)->GetStringUTFChars(env, path, NULL);
  if (p == NULL) return;
  ok(env, qpack_linear_save((const qpack_linear*)(intptr_t)handle, p));
  (*env)->ReleaseStringUTFChars(env, path, p);
}

/* A handle over the file's one linear, its packed bytes used in place from a
 * read-only mapping (0 and an exception on failure). */
JNIEXPORT jlong JNICALL Java_org_qpack_PackedLinear_nativeLoad(JNIEnv* env, jclass cls,
                                                              jstring path, jboolean strict) {
  (void)cls;
  if (path == NULL) {
    throw_arg(env, "path must not be null");
    return 0;
  }
  const char* p = (*env)->GetStringUTFChars(env, path, NULL);
  if (p == NULL) return 0;
  qpack_load_options o;
  qpack_load_options_init(&o);
  o.strict = strict ? 1 : 0;
  qpack_linear* lin = NULL;
  if (ok(env, qpack_linear_load(p, &o, &lin))) {
    qpack_linear_info info;
    if (ok(env, qpack_linear_get_info(lin, &info)) && info.mode != QPACK_MODE_INT8_STATIC) {
      throw_arg(env, "the file's linear is not a static int8 layer");
    }
  }
  (*env)->ReleaseStringUTFChars(env, path, p);
  if ((*env)->ExceptionCheck(env)) {
    qpack_linear_destroy(lin);
    return 0;
  }
  return (jlong)(intptr_t)lin;
}

JNIEXPORT jlongArray JNICALL Java_org_qpack_PackedLinear_nativeShape(JNIEnv* env, jclass cls,
                                                                    jlong handle) {
  (void)cls;
  qpack_linear_info info;
  if (!ok(env, qpack_linear_get_info((const qpack_linear*)(intptr_t)handle, &info))) return NULL;
  jlongArray out = (*env)->NewLongArray(env, 2);
  if (out == NULL) return NULL;
  const jlong shape[2] = {info.out_features, info.in_features};
  (*env)->SetLongArrayRegion(env, out, 0, 2, shape);
  return out;
}
