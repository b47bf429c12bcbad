package stateops;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
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
      return new Output(builder.build(), path, overwriteIfPossible, overwriteIfPossible ? null : this);
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

  /** Rethrow ``t`` as it is: Scala declares no checked exceptions, and Spark catches by type. */
  @SuppressWarnings("unchecked")
  static <T extends Throwable> T unchecked(Throwable t) throws T {
    throw (T) t;
  }

  static final class Output extends CheckpointFileManager.CancellableFSDataOutputStream {
    private final FSDataOutputStream out;
    private final Path path;
    private final boolean overwrite;
    private final ConditionalCheckpointFileManager fenced; // null: not a log file
    private boolean done;

    Output(
        FSDataOutputStream out,
        Path path,
        boolean overwrite,
        ConditionalCheckpointFileManager fenced) {
      super(out);
      this.out = out;
      this.path = path;
      this.overwrite = overwrite;
      this.fenced = fenced;
    }

    @Override
    public synchronized void close() throws IOException {
      if (done) {
        return;
      }
      if (fenced != null) {
        try {
          fenced.fence(path);
        } catch (IOException | RuntimeException e) {
          cancel(); // nothing is uploaded
          throw e;
        }
      }
      done = true;
      try {
        out.close(); // the upload: whatever fails here fails the write
      } catch (RemoteFileChangedException e) { // 412: another writer created it first
        if (overwrite) {
          throw e;
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
