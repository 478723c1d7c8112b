package org.qpack;

/** A qpack backend or internal error; the message is qpack_last_error(). */
public class QpackException extends RuntimeException {
  public QpackException(String message) {
    super(message);
  }
}
