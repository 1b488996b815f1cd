/* tcp_exchange.c -- how much of a link does Open MPI move when two processes exchange a
 * buffer each way at once, as the ring allreduce does across hosts?
 *
 * Every rank sends MIB MiB to rank + 1 and receives as much from rank - 1, in chunks of
 * CHUNK_KIB KiB, INFLIGHT chunks posted at a time (MPI_Irecv + MPI_Isend) and waited for by
 *   0: MPI_Waitall            1: MPI_Testall, spinning
 *   2: MPI_Testall, then sleeping up to MAX_US between tests (as bluefog waits across hosts)
 *   3: MPI_Testall, then sched_yield
 * and prints the mean time over REPS and the share of a link of RATE bits/s that it moved
 * (the bytes each rank sent over the time). UNI=1: rank 0 only sends, rank 1 only receives.
 * THREAD_MULTIPLE=1 in the environment: MPI_Init_thread(MPI_THREAD_MULTIPLE), as bluefog.
 *
 *   mpicc -O2 bench/tcp_exchange.c -o /tmp/tcp_exchange
 *   bench/netns/hosts.sh up 2 250mbit
 *   mpirun -np 2 -H 10.213.77.1:1,10.213.77.2:1 --mca plm_rsh_agent bench/netns/rsh.sh \
 *     --mca btl self,tcp --mca btl_tcp_if_include 10.213.77.0/24 \
 *     --mca oob_tcp_if_include 10.213.77.0/24 [--mca btl_tcp_links 2 ...] \
 *     /tmp/tcp_exchange MIB CHUNK_KIB WAIT MAX_US REPS RATE [INFLIGHT [UNI]]
 *
 * Launches of one setting spread widely on a shared machine: interleave the settings.
 */
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void Nap(long us) {
  struct timespec t = {0, us * 1000};
  nanosleep(&t, NULL);
}

static void Wait(MPI_Request* r, int n, int mode, long max_us) {
  int done = 0, tests = 0;
  long pause = 20;
  double start = MPI_Wtime();
  if (mode == 0) {
    MPI_Waitall(n, r, MPI_STATUSES_IGNORE);
    return;
  }
  for (;;) {
    MPI_Testall(n, r, &done, MPI_STATUSES_IGNORE);
    if (done) return;
    if (mode == 1) continue;
    if (mode == 3) {
      sched_yield();
      continue;
    }
    if (++tests < 100) continue;
    if (MPI_Wtime() - start < 1e-3) {
      sched_yield();
      continue;
    }
    Nap(pause);
    pause = pause * 2 > max_us ? max_us : pause * 2;
  }
}

int main(int argc, char** argv) {
  int provided, rank, n;
  if (getenv("THREAD_MULTIPLE")) {
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  } else {
    MPI_Init(&argc, &argv);
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc < 7) {
    if (rank == 0) fprintf(stderr, "usage: MIB CHUNK_KIB WAIT MAX_US REPS RATE [INFLIGHT [UNI]]\n");
    MPI_Finalize();
    return 2;
  }
  const long bytes = atol(argv[1]) << 20, chunk = atol(argv[2]) << 10;
  const int mode = atoi(argv[3]), reps = atoi(argv[5]);
  const long max_us = atol(argv[4]);
  const double rate = atof(argv[6]);
  const int inflight = argc > 7 ? atoi(argv[7]) : 1, uni = argc > 8 ? atoi(argv[8]) : 0;
  char* sendbuf = malloc(bytes);
  char* recvbuf = malloc(bytes);
  memset(sendbuf, 1, bytes);
  memset(recvbuf, 0, bytes);
  const int right = (rank + 1) % n, left = (rank - 1 + n) % n;
  MPI_Request* reqs = malloc(sizeof(MPI_Request) * 2 * inflight);
  double sum = 0, worst = 0;
  for (int it = 0; it <= reps; ++it) { /* the first is a warm-up */
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    for (long off = 0; off < bytes; off += chunk * inflight) {
      int k = 0;
      for (int j = 0; j < inflight && off + j * chunk < bytes; ++j) {
        const long o = off + j * chunk;
        const int len = (int)(o + chunk > bytes ? bytes - o : chunk);
        if (!uni || rank == 1)
          MPI_Irecv(recvbuf + o, len, MPI_BYTE, left, 1, MPI_COMM_WORLD, &reqs[k++]);
        if (!uni || rank == 0)
          MPI_Isend(sendbuf + o, len, MPI_BYTE, right, 1, MPI_COMM_WORLD, &reqs[k++]);
      }
      Wait(reqs, k, mode, max_us);
    }
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (it > 0) {
      sum += t;
      if (t > worst) worst = t;
    }
  }
  if (rank == 0) {
    const double mean = sum / reps;
    printf(
        "%ld MiB, %ld KiB chunks, %d in flight, wait %d (max %ld us): mean %.1f ms, "
        "share of the link %.2f (slowest %.2f)\n",
        bytes >> 20, chunk >> 10, inflight, mode, max_us, mean * 1e3, bytes * 8 / mean / rate,
        bytes * 8 / worst / rate);
  }
  free(reqs);
  free(sendbuf);
  free(recvbuf);
  MPI_Finalize();
  return 0;
}
