// make jni-test: org.qpack.PackedLinear through libqpack_jni.so on the host JVM,
// checked against a Java reference (exact, or within 1 quantum of uint8).
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import java.util.concurrent.atomic.AtomicInteger;
import org.qpack.PackedLinear;

public final class TestPackedLinear {
  private static int passes = 0;
  private static int failures = 0;

  private static void expect(boolean ok, String what) {
    if (ok) {
      passes++;
    } else {
      failures++;
      System.err.println("FAIL: " + what);
    }
  }

  private interface Body {
    void run() throws Exception;
  }

  private static void expectThrows(Class<? extends Throwable> type, String what, Body body) {
    try {
      body.run();
      expect(false, what + ": nothing thrown");
    } catch (Throwable t) {
      expect(type.isInstance(t), what + ": threw " + t);
      if (type.isInstance(t)) {
        System.out.println("  " + what + " -> " + t.getClass().getSimpleName() + ": " + t.getMessage());
      }
    }
  }

  /** The float reference of a static int8 linear, rounded half to even, clamped to uint8. */
  static int[] reference(byte[] w, float[] scales, float[] bias, int n, int k, byte[] x, int m,
      float inScale, int inZp, float outScale, int outZp) {
    int[] y = new int[m * n];
    for (int i = 0; i < m; i++) {
      for (int j = 0; j < n; j++) {
        long acc = 0;
        for (int l = 0; l < k; l++) {
          acc += (long) ((x[i * k + l] & 0xff) - inZp) * w[j * k + l];
        }
        float s = scales.length == 1 ? scales[0] : scales[j];
        double real = (double) acc * inScale * s + (bias == null ? 0.0 : bias[j]);
        double q = Math.rint(real / outScale) + outZp;
        y[i * n + j] = (int) Math.max(0, Math.min(255, q));
      }
    }
    return y;
  }

  static int maxDiff(byte[] got, int[] ref) {
    int worst = got.length == ref.length ? 0 : 256;
    for (int i = 0; i < Math.min(got.length, ref.length); i++) {
      worst = Math.max(worst, Math.abs((got[i] & 0xff) - ref[i]));
    }
    return worst;
  }

  public static void main(String[] args) throws Exception {
    String info = PackedLinear.buildInfo();
    System.out.println(info);
    expect(info.contains("qnnpack"), "build info names qnnpack");

    Random rnd = new Random(11);
    int[][] shapes = {{1, 16, 8}, {5, 37, 21}, {32, 256, 64}, {3, 1000, 10}};
    for (int[] shape : shapes) {
      int m = shape[0], k = shape[1], n = shape[2];
      for (boolean perChannel : new boolean[] {true, false}) {
        byte[] w = new byte[n * k];
        for (int i = 0; i < w.length; i++) w[i] = (byte) (rnd.nextInt(255) - 127);
        float[] scales = new float[perChannel ? n : 1];
        for (int i = 0; i < scales.length; i++) scales[i] = 0.001f * (1 + rnd.nextInt(8));
        float[] bias = new float[n];
        for (int i = 0; i < n; i++) bias[i] = rnd.nextInt(200) / 50.0f - 2.0f;
        byte[] x = new byte[m * k];
        rnd.nextBytes(x);
        float inScale = 0.04f, outScale = 0.25f;
        int inZp = 120, outZp = 100;
        String what = "linear m" + m + " k" + k + " n" + n + (perChannel ? " per-channel" : " per-tensor");
        try (PackedLinear lin = new PackedLinear(w, n, k, scales, bias, outScale, outZp, false)) {
          expect(!lin.hasOriginal(), what + ": original released");
          byte[] y = lin.run(x, m, inScale, inZp);
          int[] ref = reference(w, scales, bias, n, k, x, m, inScale, inZp, outScale, outZp);
          int diff = maxDiff(y, ref);
          int exact = 0;
          for (int i = 0; i < ref.length; i++) exact += (y[i] & 0xff) == ref[i] ? 1 : 0;
          System.out.printf("  %-34s %5d outputs, %5d equal to the Java reference, max diff %d%n",
              what, ref.length, exact, diff);
          expect(diff <= 1, what + ": max diff " + diff + " quanta");
          expect(Arrays.equals(lin.unpack(), w), what + ": unpack bit-exact after release");
        }
      }
    }

    // Threads sharing one object: every run equals the single-threaded output.
    byte[] w = new byte[48 * 200];
    rnd.nextBytes(w);
    for (int i = 0; i < w.length; i++) if (w[i] == -128) w[i] = -127;
    float[] scales = new float[48];
    Arrays.fill(scales, 0.002f);
    byte[] x = new byte[7 * 200];
    rnd.nextBytes(x);
    PackedLinear shared = new PackedLinear(w, 48, 200, scales, null, 0.3f, 128, true);
    expect(shared.hasOriginal(), "retain=true keeps the original");
    byte[] expected = shared.run(x, 7, 0.05f, 128);
    AtomicInteger mismatches = new AtomicInteger();
    List<Thread> threads = new ArrayList<>();
    for (int t = 0; t < 4; t++) {
      Thread th = new Thread(() -> {
        for (int i = 0; i < 200; i++) {
          if (!Arrays.equals(shared.run(x, 7, 0.05f, 128), expected)) mismatches.incrementAndGet();
        }
      });
      threads.add(th);
      th.start();
    }
    for (Thread th : threads) th.join();
    expect(mismatches.get() == 0, "4 threads x 200 runs equal the first run");

    // Errors: Java exceptions with qpack's message; the object stays usable.
    expectThrows(IllegalArgumentException.class, "input of the wrong length",
        () -> shared.run(new byte[5], 7, 0.05f, 128));
    expectThrows(IllegalArgumentException.class, "zero point 256",
        () -> shared.run(x, 7, 0.05f, 256));
    expectThrows(IllegalArgumentException.class, "weight of the wrong length",
        () -> new PackedLinear(new byte[10], 3, 4, new float[] {1f}, null, 1f, 0, true));
    expectThrows(IllegalArgumentException.class, "two scales for three outputs",
        () -> new PackedLinear(new byte[12], 3, 4, new float[] {1f, 1f}, null, 1f, 0, true));
    expect(Arrays.equals(shared.run(x, 7, 0.05f, 128), expected), "usable after errors");

    // Model files: save, load (mapped), the same outputs and weights; bad files throw IOException.
    java.io.File dir = java.nio.file.Files.createTempDirectory("qpack-jni").toFile();
    String path = new java.io.File(dir, "linear.qpk").getPath();
    shared.save(path);
    try (PackedLinear loaded = PackedLinear.load(path)) {
      expect(loaded.inFeatures() == 200 && loaded.outFeatures() == 48, "loaded shape");
      expect(Arrays.equals(loaded.run(x, 7, 0.05f, 128), expected), "loaded model file: same outputs");
      expect(Arrays.equals(loaded.unpack(), w), "loaded model file: unpack bit-exact");
    }
    byte[] file = java.nio.file.Files.readAllBytes(new java.io.File(path).toPath());
    file[file.length / 2] ^= 0x01;
    String bad = new java.io.File(dir, "bad.qpk").getPath();
    java.nio.file.Files.write(new java.io.File(bad).toPath(), file);
    expectThrows(java.io.IOException.class, "load of a corrupt file", () -> PackedLinear.load(bad).close());
    expectThrows(java.io.IOException.class, "load of a missing file",
        () -> PackedLinear.load(new java.io.File(dir, "missing.qpk").getPath()).close());
    new java.io.File(path).delete();
    new java.io.File(bad).delete();
    dir.delete();
    shared.close();
    shared.close();
    expect(shared.isClosed(), "closed");
    expectThrows(IllegalStateException.class, "run after close", () -> shared.run(x, 7, 0.05f, 128));
    expectThrows(IllegalStateException.class, "unpack after close", shared::unpack);

    System.out.println("jni: " + passes + " passed, " + failures + " failed");
    System.exit(failures == 0 ? 0 : 1);
  }
}
