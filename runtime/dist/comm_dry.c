/* comm_dry.c: the backend of a dry-run world (sh_comm_init_dry): one process stands for one
 * rank of a world of N. Collectives complete at once and move no data; comm.c counts them
 * and their bytes exactly as for a real group, so a dry run's counts are a real run's.
 *
 * A split is collective: each rank brings its own color, and the one simulated rank cannot
 * know the others'. The dry world knows its node layout (local_size ranks per node, ranks
 * numbered node by node), so it answers the splits whose members follow from that layout:
 * the ranks of this node (sh_comm_split_node) and, after that, the ranks with this rank's
 * local rank, one per node (color = local rank, key = node: hybrid sharding's replicate
 * groups, which fsdp makes right after the node groups; before a node split, rank 0's
 * (0, 0) could as well be any other split). Any other split fails, naming it. */
#include "comm_internal.h"
#include "core/status_internal.h"

static int node_split_done;   /* one dry world per process */

static int dry_start(sh_comm_work *w) { w->done = 1; return SH_OK; }
static int dry_test(sh_comm_work *w, int *done) { *done = 1; return SH_OK; }
static void dry_abandon(sh_comm_work *w) {}
static void dry_destroy(sh_comm *c) {}

static int dry_split(sh_comm *parent, int color, int key, sh_comm *child) {
  if (color < 0) { child->size = 0; return SH_OK; }
  int whole_nodes = parent->is_world && parent->nodes_uniform;
  if (whole_nodes && parent->splitting_node) {
    child->rank = parent->local_rank;
    child->size = parent->local_size;
    node_split_done = 1;
  } else if (whole_nodes && node_split_done && color == parent->local_rank && key == parent->node) {
    child->rank = parent->node;
    child->size = parent->n_nodes;
  } else {
    return sh_fail(SH_ERR_COMM, "dry run: split of %s by color %d, key %d: the simulated rank %d cannot know "
                   "the other ranks' colors; a dry run answers the splits of its node layout only (split_node, "
                   "and color = local rank, key = node: hybrid_group = \"node\")", parent->name, color, key, parent->rank);
  }
  child->cpu = &sh_comm_dry_backend;
  return SH_OK;
}

const sh_comm_backend sh_comm_dry_backend = {
  .name = "dry", .start = dry_start, .test = dry_test, .abandon = dry_abandon, .split = dry_split,
  .destroy = dry_destroy,
};
