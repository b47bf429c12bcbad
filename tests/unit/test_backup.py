"""What a backup URL and a manifest path may be, checked before S3 is asked."""

from __future__ import annotations

import pytest

from stateops.core.errors import StateOpsError
from stateops.core.storage import safe_relative_path
from stateops.ops.backup import _age, split_backup_url

pytestmark = pytest.mark.unit


def test_a_backup_url_ends_in_a_backup_id_or_latest():
    loc, backup_id = split_backup_url("s3://backups/prod/page_visits/b-000012-20261124T101010Z")
    assert (loc.bucket, loc.prefix, backup_id) == (
        "backups",
        "prod/page_visits",
        "b-000012-20261124T101010Z",
    )
    assert split_backup_url("s3://backups/prod/page_visits/latest")[1] == "latest"
    with pytest.raises(StateOpsError, match="no backup id at the end"):
        split_backup_url("s3://backups/prod/page_visits")


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "../x", "./../x", "state/../../x", "state\\0\\1.zip", "a\\..\\b"]
)
def test_a_manifest_path_that_leaves_the_target_is_refused(path):
    with pytest.raises(StateOpsError, match="escapes the restore target"):
        safe_relative_path(path, "the restore target")


def test_a_manifest_path_inside_the_target_is_kept():
    assert str(safe_relative_path("state/0/1/2.zip", "the restore target")) == "state/0/1/2.zip"


def test_backups_are_ordered_by_when_they_were_taken_not_by_their_batch():
    """Two manifests written in the same second: the backup that started later is the later,
    though its batch is older (a backup of batch 1 right after one of batch 2)."""
    second = "2026-12-07T08:53:17+00:00"
    newer_batch = {"backup_id": "b-000002-20261207T085316900000Z", "created_at": second}
    older_batch = {"backup_id": "b-000001-20261207T085317100000Z", "created_at": second}
    earlier = {"backup_id": "b-000009-20261207T085315000000Z", "created_at": "2026-12-07T08:53:16Z"}
    assert sorted([older_batch, newer_batch, earlier], key=_age) == [
        earlier,
        newer_batch,
        older_batch,
    ]
