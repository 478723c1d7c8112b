package org.qpack;

/** A qpack backend or internal error; the message is qpack_last_error(). */
public class QpackException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  public QpackException(String message) {
    super(message);
  }
}
