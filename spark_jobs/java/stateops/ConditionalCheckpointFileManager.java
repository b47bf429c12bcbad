package stateops;

import java.io.IOException;
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
 */
public class ConditionalCheckpointFileManager extends AbstractFileContextBasedCheckpointFileManager {
  static final String CONDITIONAL = "fs.option.create.conditional.overwrite";
  private final FileSystem fs;

  public ConditionalCheckpointFileManager(Path path, Configuration conf) throws IOException {
    super(path, conf);
    fs = path.getFileSystem(conf);
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
      return new Output(builder.build(), path, overwriteIfPossible);
    } catch (IOException e) {
      throw ConditionalCheckpointFileManager.<RuntimeException>unchecked(e);
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
    private boolean done;

    Output(FSDataOutputStream out, Path path, boolean overwrite) {
      super(out);
      this.out = out;
      this.path = path;
      this.overwrite = overwrite;
    }

    @Override
    public synchronized void close() throws IOException {
      if (done) {
        return;
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
