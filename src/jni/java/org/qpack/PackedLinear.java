package org.qpack;

import java.io.IOException;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import java.util.function.LongFunction;

/**
 * A static int8 linear layer packed once by qpack (QNNPACK on ARM): int8 weights
 * [outFeatures, inFeatures] with one scale per output (or one in all), uint8
 * activations with a scale and zero point per call, uint8 outputs.
 *
 * <p>Any number of threads may call {@link #run} at once. {@link #close} frees the
 * packed weights; later calls throw IllegalStateException. Bytes hold uint8 values
 * as Java's signed byte (use {@code b & 0xff}).
 */
public final class PackedLinear implements AutoCloseable {
  static {
    System.loadLibrary("qpack_jni");
  }

  private final int inFeatures;
  private final int outFeatures;
  private long handle;
  // Runs share the read side; close() takes the write side before destroying the
  // native object (qpack_linear_destroy must not race with any other call).
  private final ReentrantReadWriteLock lock = new ReentrantReadWriteLock();

  /**
   * @param weight row-major int8 [outFeatures, inFeatures]
   * @param weightScales outFeatures scales (per channel) or one (per tensor)
   * @param bias null or outFeatures floats, in the real domain
   * @param retain keep the original weights (true) or release them once packed;
   *     {@link #unpack} works either way
   */
  public PackedLinear(byte[] weight, int outFeatures, int inFeatures, float[] weightScales,
      float[] bias, float outputScale, int outputZeroPoint, boolean retain) {
    this.inFeatures = inFeatures;
    this.outFeatures = outFeatures;
    this.handle = nativeCreate(weight, outFeatures, inFeatures, weightScales, bias, outputScale,
        outputZeroPoint, retain);
  }

  private PackedLinear(long handle) {
    long[] shape = nativeShape(handle);
    this.outFeatures = (int) shape[0];
    this.inFeatures = (int) shape[1];
    this.handle = handle;
  }

  /**
   * Loads a packed model file (.qpk) holding one static int8 linear, written by
   * {@link #save} or by Python's {@code qpack.save}: its packed weights are used
   * in place from a read-only mapping of the file when they were packed for this
   * CPU, else re-packed from the packed form (or refused when {@code strict}).
   *
   * @throws IOException the file cannot be read, or is corrupt, truncated or
   *     packed elsewhere under {@code strict}
   */
  public static PackedLinear load(String path, boolean strict) throws IOException {
    return new PackedLinear(nativeLoad(path, strict));
  }

  public static PackedLinear load(String path) throws IOException {
    return load(path, false);
  }

  /** Writes this layer to a packed model file (.qpk; a temporary file renamed over path). */
  public void save(String path) throws IOException {
    lock.readLock().lock();
    try {
      if (handle == 0) {
        throw new IllegalStateException("PackedLinear is closed");
      }
      nativeSave(handle, path);
    } finally {
      lock.readLock().unlock();
    }
  }

  public int inFeatures() {
    return inFeatures;
  }

  public int outFeatures() {
    return outFeatures;
  }

  /** input: uint8 [batch, inFeatures]; returns uint8 [batch, outFeatures]. */
  public byte[] run(byte[] input, int batch, float inputScale, int inputZeroPoint) {
    return withLive(h -> nativeRun(h, input, batch, inputScale, inputZeroPoint));
  }

  /** The int8 weights, bit-exact, also after the original was released. */
  public byte[] unpack() {
    return withLive(PackedLinear::nativeUnpack);
  }

  public boolean hasOriginal() {
    return withLive(PackedLinear::nativeHasOriginal);
  }

  public boolean isClosed() {
    lock.readLock().lock();
    try {
      return handle == 0;
    } finally {
      lock.readLock().unlock();
    }
  }

  /** Frees the packed weights now. Idempotent. */
  @Override
  public void close() {
    lock.writeLock().lock();
    try {
      if (handle != 0) {
        nativeClose(handle);
        nativeDestroy(handle);
        handle = 0;
      }
    } finally {
      lock.writeLock().unlock();
    }
  }

  /** qpack's build: version, architecture, backends, QNNPACK kernels, mobile flag. */
  public static String buildInfo() {
    return nativeBuildInfo();
  }

  // Calls body with the native handle while holding the read side of the lock.
  private <T> T withLive(LongFunction<T> body) {
    lock.readLock().lock();
    try {
      if (handle == 0) {
        throw new IllegalStateException("PackedLinear is closed");
      }
      return body.apply(handle);
    } finally {
      lock.readLock().unlock();
    }
  }

  private static native String nativeBuildInfo();

  private static native long nativeCreate(byte[] weight, int outFeatures, int inFeatures,
      float[] weightScales, float[] bias, float outputScale, int outputZeroPoint, boolean retain);

  private static native byte[] nativeRun(long handle, byte[] input, int batch, float inputScale,
      int inputZeroPoint);

  private static native byte[] nativeUnpack(long handle);

  private static native boolean nativeHasOriginal(long handle);

  private static native void nativeClose(long handle);

  private static native void nativeDestroy(long handle);

  private static native void nativeSave(long handle, String path) throws IOException;

  private static native long nativeLoad(String path, boolean strict) throws IOException;

  private static native long[] nativeShape(long handle);
}
