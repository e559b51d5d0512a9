/* Mixture-of-experts dispatch and combine with all_to_all (expert parallelism).
 *
 * A mixture-of-experts (MoE) layer replaces one big feed-forward block with E
 * smaller ones, the experts, and a router that sends each token to one of
 * them. With expert parallelism the experts are spread over the ranks
 * (E / size each), so a token usually has to travel to the rank that holds
 * its expert and its result has to travel back. One all_to_all moves every
 * rank's tokens to their experts at once (the dispatch), a second brings the
 * results home (the combine):
 *
 *   1. route:    each token picks an expert (here a hash: any router works);
 *   2. pack:     tokens go into fixed-size slots, `capacity` per expert, so
 *                every part has the same shape; a token whose expert's slots
 *                are full is dropped (it skips the experts, as in real layers);
 *   3. dispatch: all_to_all: part j of my send buffer lands on rank j;
 *   4. experts:  each rank runs its experts on the slots it received;
 *   5. combine:  all_to_all back: the results return to the slots they left;
 *   6. unpack:   each token reads its result from its slot (a dropped one
 *                keeps its input: the residual connection carries it).
 * Finally every token is checked against a local recomputation.
 *
 * Run:   mlxdist-launch -n 4 -- ./moe_dispatch [tokens [hidden [experts_per_rank [capacity]]]]
 * The defaults (64 tokens of 32 floats, 2 experts per rank, capacity 1.25 x the
 * fair share) drop a few tokens, as real layers do. Exit 0 when every token is right. */
#include <limits.h>
#include <mlx/c/mlx.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef MLXDIST_HAS_ALL_TO_ALL
int main(void) {
  fprintf(stderr, "moe_dispatch: this mlxdist has no mlx_distributed_all_to_all\n");
  return 1;
}
#else

/* The router: a token's expert from its global id (a stand-in for the
 * learned gate, argmax of softmax(x W); top-1 routing). */
static int route(long global_token, int experts) {
  uint32_t h = (uint32_t)global_token * 2654435761u; /* Knuth's multiplicative hash */
  h ^= h >> 15;
  return (int)(h % (uint32_t)experts);
}

/* A token's input: small multiples of 1/4, so that every result below is
 * exact in float32 and can be compared bit for bit. */
static float token_value(long global_token, int h) {
  return (float)((global_token * 7 + h * 3) % 64) * 0.25f;
}

/* The stand-in expert: expert e computes x * (e + 1) + e on each element. A
 * real one is a small MLP (two matrix products and an activation). */
static float expert_fn(int e, float x) { return x * (float)(e + 1) + (float)e; }

static int arg(int argc, char** argv, int i, int dflt) {
  if (argc <= i) return dflt;
  char* end;
  long v = strtol(argv[i], &end, 10);
  if (*end || v <= 0 || v > 1000000) {
    fprintf(stderr, "moe_dispatch: argument %d (%s) must be an integer from 1 to 1000000\n", i,
            argv[i]);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char** argv) {
  mlx_distributed_group world = mlx_distributed_group_new();
  if (mlx_distributed_init(&world, false, NULL) != 0) return 1; /* alone: a group of one */
  const int rank = mlx_distributed_group_rank(world);
  const int size = mlx_distributed_group_size(world);
  mlx_stream comm = mlx_stream_new(); /* the null stream: the group's communication stream */

  const int T = arg(argc, argv, 1, 64); /* tokens on this rank */
  const int H = arg(argc, argv, 2, 32); /* hidden size: floats per token */
  const int EL = arg(argc, argv, 3, 2); /* experts held by each rank */
  const int E = EL * size;              /* experts in all; expert e lives on rank e / EL */
  /* capacity: slots per expert per sending rank. Each expert expects T / E of
   * this rank's tokens; real layers allow capacity_factor (1.0-2.0) times that
   * and drop the overflow. Here 1.25 (5/4), rounded up; a fourth argument sets
   * the slots directly. */
  const int C = arg(argc, argv, 4, (5 * T + 4 * E - 1) / (4 * E));
  if ((double)size * EL * C * H > INT_MAX) {
    fprintf(stderr, "moe_dispatch: %d ranks x %d experts x %d slots x %d floats is too large\n",
            size, EL, C, H);
    return 2;
  }
  const int part_rows = EL * C;      /* rows sent to one rank: its EL experts x C slots */
  const int rows = size * part_rows; /* rows of the send buffer: one part per rank */

  /* 1. route. x is this rank's [T, H] activations; expert[t] is token t's
   * expert, slot[t] the row it takes in the send buffer (-1: dropped). */
  float* x = malloc((size_t)T * H * sizeof(float));
  int* expert = malloc((size_t)T * sizeof(int));
  int* slot = malloc((size_t)T * sizeof(int));
  int* fill = calloc((size_t)E, sizeof(int));            /* slots taken per expert */
  float* send = calloc((size_t)rows * H, sizeof(float)); /* padding stays 0 */
  int32_t* counts = calloc((size_t)size * EL, sizeof(int32_t));
  if (!x || !expert || !slot || !fill || !send || !counts) {
    fprintf(stderr, "moe_dispatch: out of memory\n");
    return 1;
  }
  int dropped = 0;
  for (int t = 0; t < T; t++) {
    long g = (long)rank * T + t; /* the token's id across the job */
    for (int h = 0; h < H; h++) x[(size_t)t * H + h] = token_value(g, h);
    expert[t] = route(g, E);
  }

  /* 2. pack. The send buffer is [size * EL * C, H]: part j (rows j*EL*C ...)
   * goes to rank j and holds, for each of rank j's EL experts in turn, C slots.
   * Tokens fill their expert's slots in token order; once they are full, the
   * rest of that expert's tokens are dropped. counts[j*EL + l] says how many
   * slots of rank j's local expert l are real (the rest is padding). */
  for (int t = 0; t < T; t++) {
    int e = expert[t];
    if (fill[e] == C) {
      slot[t] = -1;
      dropped++;
      continue;
    }
    int dst = e / EL, local = e % EL;
    slot[t] = dst * part_rows + local * C + fill[e]++;
    memcpy(send + (size_t)slot[t] * H, x + (size_t)t * H, (size_t)H * sizeof(float));
  }
  for (int e = 0; e < E; e++) counts[e] = fill[e]; /* e = j*EL + l: the same order */

  /* 3. dispatch. all_to_all splits axis 0 into `size` equal parts: part j of
   * my buffer becomes part `rank` of rank j's result. So recv's part i holds
   * rank i's tokens for my experts, and recv_counts' part i how many there are.
   * The counts could be left out (experts would then also run on the padding,
   * as fixed-shape kernels do); with them an expert skips the empty slots. */
  int shape[2] = {rows, H};
  int cshape[1] = {size * EL};
  mlx_array xs = mlx_array_new_data(send, shape, 2, MLX_FLOAT32);
  mlx_array cs = mlx_array_new_data(counts, cshape, 1, MLX_INT32);
  mlx_array recv = mlx_array_new(), recv_counts = mlx_array_new();
  if (mlx_distributed_all_to_all(&recv, xs, world, comm) != 0 ||
      mlx_distributed_all_to_all(&recv_counts, cs, world, comm) != 0)
    return 1;
  const float* in = mlx_array_data_float32(recv); /* waits for the exchange */
  const int32_t* n_in = mlx_array_data_int32(recv_counts);
  if (!in || !n_in) return 1;

  /* 4. experts. My local expert l is global expert rank*EL + l; rank i's slots
   * for it are rows i*EL*C + l*C ... (+ n_in[i*EL + l]). Each expert runs once
   * on all its tokens from every rank (the point of gathering them). */
  float* out = calloc((size_t)rows * H, sizeof(float));
  if (!out) return 1;
  long processed = 0;
  for (int l = 0; l < EL; l++) {
    int e = rank * EL + l;
    for (int i = 0; i < size; i++) {
      int n = n_in[i * EL + l];
      for (int c = 0; c < n; c++) {
        size_t row = (size_t)i * part_rows + (size_t)l * C + (size_t)c;
        for (int h = 0; h < H; h++) out[row * H + h] = expert_fn(e, in[row * H + h]);
      }
      processed += n;
    }
  }

  /* 5. combine. The same exchange backwards: part i of `out` (the results for
   * rank i's tokens) goes home to rank i, into the part of its result named
   * after me, in the slots the tokens left from. */
  mlx_array ys = mlx_array_new_data(out, shape, 2, MLX_FLOAT32);
  mlx_array back = mlx_array_new();
  if (mlx_distributed_all_to_all(&back, ys, world, comm) != 0) return 1;
  const float* res = mlx_array_data_float32(back);
  if (!res) return 1;

  /* 6. unpack, and check every token against a local recomputation: a kept
   * token gets its expert's output, a dropped one its input. */
  float* y = malloc((size_t)T * H * sizeof(float));
  if (!y) return 1;
  int bad = 0;
  for (int t = 0; t < T; t++) {
    const float* src = slot[t] < 0 ? x + (size_t)t * H : res + (size_t)slot[t] * H;
    memcpy(y + (size_t)t * H, src, (size_t)H * sizeof(float));
    for (int h = 0; h < H; h++) {
      float xv = token_value((long)rank * T + t, h);
      float want = slot[t] < 0 ? xv : expert_fn(expert[t], xv);
      if (y[(size_t)t * H + h] != want) {
        if (bad++ < 5)
          fprintf(stderr, "moe_dispatch: rank %d token %d element %d: got %g, want %g\n", rank, t,
                  h, (double)y[(size_t)t * H + h], (double)want);
        break;
      }
    }
  }

  /* A job-wide summary: every rank's drops and mismatches summed. */
  int32_t tally[3] = {dropped, bad, (int32_t)processed};
  int tshape[1] = {3};
  mlx_array tl = mlx_array_new_data(tally, tshape, 1, MLX_INT32), total = mlx_array_new();
  mlx_distributed_all_sum(&total, tl, world, comm);
  const int32_t* tot = mlx_array_data_int32(total);
  printf("rank %d/%d: %d tokens, %d dropped; %d experts here ran on %ld tokens; %s\n", rank, size,
         T, dropped, EL, processed, bad ? "MISMATCH" : "ok");
  if (rank == 0 && tot)
    printf(
        "moe_dispatch: %d ranks, %d experts, capacity %d: %d of %ld tokens dropped, %d "
        "expert results, %d mismatched: %s\n",
        size, E, C, tot[0], (long)T * size, tot[2], tot[1],
        tot[1] == 0 && tot[0] + tot[2] == T * size ? "all tokens correct" : "FAILED");
  int failed = bad != 0 || !tot || tot[1] != 0 || tot[0] + tot[2] != T * size;

  mlx_array_free(xs), mlx_array_free(cs), mlx_array_free(recv), mlx_array_free(recv_counts);
  mlx_array_free(ys), mlx_array_free(back), mlx_array_free(tl), mlx_array_free(total);
  free(x), free(expert), free(slot), free(fill), free(send), free(counts), free(out), free(y);
  mlx_stream_free(comm);
  mlx_distributed_group_free(world);
  return failed ? 1 : 0;
}
#endif
