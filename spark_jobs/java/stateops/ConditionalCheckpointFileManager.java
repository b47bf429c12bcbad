package stateops;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.FileNotFoundException;
import java.io.FilterOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.util.Arrays;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.UnsupportedFileSystemException;
import org.apache.hadoop.fs.s3a.RemoteFileChangedException;
import org.apache.spark.sql.execution.streaming.checkpointing.AbstractFileContextBasedCheckpointFileManager;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager;

/**
 * Spark's checkpoint file manager for checkpoints in S3 (s3a://), in place of Spark's
 * AbortableStreamBasedCheckpointFileManager, whose stream's close() logs and swallows every
 * failure: a second driver's write of a log file that exists, and a failed upload of an offsets
 * or commits file, so a batch counted as written whose file is not there.
 *
 * <p>Each file is one PUT when its stream closes, as with the abortable manager (S3 has no
 * rename). A file Spark must not overwrite (its offsets and commits logs) is created only where
 * none exists (S3A's conditional create: If-None-Match: *), so of two drivers writing one batch
 * the second fails with Hadoop's FileAlreadyExistsException, which Spark reports as two queries
 * using one checkpoint. Every other failure of close() fails the write too. Built by `make jars`
 * (scripts/build_checkpoint_jar.sh) into build/jars/s3.
 *
 * <p>The lease fence: a driver the project starts sets {@code stateops.fence.holder} (the
 * checkpoint's {@code <checkpoint>.audit/holder.json}, which every process that takes the
 * query's lease writes with its token) and {@code stateops.fence.token} (its own). Before it
 * creates a log file (offsets, commits, a source's log), the manager reads that object and
 * refuses the write, uploading nothing, when it names another holder: a driver that stalled
 * past its lease and resumed plans and commits no batch over the next holder's.
 *
 * <p>A log file's create refused (412) is read back: the SDK retries a PUT whose answer was
 * lost, and the retry of one the store applied finds this very file there. Only another
 * driver's file (other bytes: each plan has its own time) is "already exists".
 */
public class ConditionalCheckpointFileManager extends AbstractFileContextBasedCheckpointFileManager {
  static final String CONDITIONAL = "fs.option.create.conditional.overwrite";
  static final String HOLDER = "stateops.fence.holder";
  static final String TOKEN = "stateops.fence.token";
  private static final ObjectMapper JSON = new ObjectMapper();
  private final FileSystem fs;
  private final Path holder; // null: no fence (a driver the project did not start)
  private final String token;
  private final Configuration conf;

  public ConditionalCheckpointFileManager(Path path, Configuration conf) throws IOException {
    super(path, conf);
    fs = path.getFileSystem(conf);
    this.conf = conf;
    String where = conf.get(HOLDER);
    holder = where == null || where.isEmpty() ? null : new Path(where);
    token = conf.get(TOKEN, "");
    if (!fs.hasPathCapability(path, CONDITIONAL)
        || !fs.hasPathCapability(path, CommonPathCapabilities.ABORTABLE_STREAM)) {
      throw new UnsupportedFileSystemException(
          path + ": its file system has no conditional create or abortable streams (S3A has both,"
              + " unless fs.s3a.create.conditional.enabled is false)");
    }
  }

  @Override
  public CheckpointFileManager.CancellableFSDataOutputStream createAtomic(
      Path path, boolean overwriteIfPossible) {
    try {
      FSDataOutputStreamBuilder<?, ?> builder =
          fs.createFile(path).recursive().overwrite(overwriteIfPossible);
      if (!overwriteIfPossible) {
        builder.must(CONDITIONAL, true);
      }
      return overwriteIfPossible
          ? new Output(builder.build(), path, null, null)
          : new Output(builder.build(), path, this, new ByteArrayOutputStream());
    } catch (IOException e) {
      throw ConditionalCheckpointFileManager.<RuntimeException>unchecked(e);
    }
  }

  /**
   * Refuse the write of log file {@code path} when the lease's holder object names another
   * holder than this driver. No object: no holder has written one (a lease taken before the
   * fence existed), and the write goes on.
   */
  void fence(Path path) throws IOException {
    if (holder == null) {
      return;
    }
    JsonNode named;
    try (InputStream in = holder.getFileSystem(conf).open(holder)) {
      named = JSON.readTree(in);
    } catch (FileNotFoundException e) {
      return;
    }
    if (!token.equals(named.path("token").asText())) {
      throw new IOException(
          "stateops: this driver no longer holds the query's lease: "
              + holder
              + " names "
              + named.path("operation").asText("?")
              + " (run "
              + named.path("run_id").asText("?")
              + "); "
              + path
              + " was not written, and this run writes no more of the checkpoint");
    }
  }

  /** Whether the object at {@code path} holds exactly {@code bytes}. */
  boolean holds(Path path, byte[] bytes) throws IOException {
    try (InputStream in = fs.open(path)) {
      return Arrays.equals(in.readAllBytes(), bytes);
    } catch (FileNotFoundException e) {
      return false;
    }
  }

  /** Rethrow ``t`` as it is: Scala declares no checked exceptions, and Spark catches by type. */
  @SuppressWarnings("unchecked")
  static <T extends Throwable> T unchecked(Throwable t) throws T {
    throw (T) t;
  }

  /** Writes to the upload and keeps a copy (a log file is small: one batch's plan). */
  static final class Copied extends FilterOutputStream {
    private final OutputStream copy;

    Copied(OutputStream out, OutputStream copy) {
      super(out);
      this.copy = copy;
    }

    @Override
    public void write(int b) throws IOException {
      out.write(b);
      copy.write(b);
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
      out.write(b, off, len);
      copy.write(b, off, len);
    }
  }

  static final class Output extends CheckpointFileManager.CancellableFSDataOutputStream {
    private final FSDataOutputStream out;
    private final Path path;
    private final ConditionalCheckpointFileManager log; // null: not a log file (overwritten)
    private final ByteArrayOutputStream copy; // a log file's bytes
    private boolean done;

    Output(
        FSDataOutputStream out,
        Path path,
        ConditionalCheckpointFileManager log,
        ByteArrayOutputStream copy) {
      super(copy == null ? out : new Copied(out, copy));
      this.out = out;
      this.path = path;
      this.log = log;
      this.copy = copy;
    }

    @Override
    public synchronized void close() throws IOException {
      if (done) {
        return;
      }
      if (log != null) {
        try {
          log.fence(path);
        } catch (IOException | RuntimeException e) {
          cancel(); // nothing is uploaded
          throw e;
        }
      }
      done = true;
      try {
        out.close(); // the upload: whatever fails here fails the write
      } catch (RemoteFileChangedException e) { // 412: a file is there
        if (log == null) {
          throw e;
        }
        if (log.holds(path, copy.toByteArray())) {
          return; // this very write, applied: its answer was lost and the SDK's retry refused
        }
        FileAlreadyExistsException exists =
            new FileAlreadyExistsException(path + " already exists (written by another driver)");
        exists.initCause(e);
        throw exists;
      }
    }

    @Override
    public synchronized void cancel() {
      if (done) {
        return;
      }
      done = true;
      try {
        out.abort(); // nothing is uploaded
        out.close();
      } catch (IOException | RuntimeException e) {
        // abandoned either way: the object was never written
      }
    }
  }
}
