/* win_progress.c -- does MPI one-sided (RMA) complete while the target is busy?
 *
 * Rank 0 = target, rank 1 = origin.  Each round: barrier; the target then
 * spends SECS seconds in one of
 *   busy   : pure computation (spin loop), no MPI calls
 *   sleep  : nanosleep, no MPI calls
 *   inmpi  : a loop of MPI_Iprobe (the MPI library can progress)
 *   thread : main thread spins, a pthread polls MPI_Iprobe every ~50 us and
 *            answers each N-byte message with a 1-byte ack (no RMA at all)
 * while the origin (after 100 ms, so the target is surely in that state) times
 *   put  : MPI_Win_lock(target) + MPI_Put(N bytes) + MPI_Win_unlock
 *   acc  : same with MPI_Accumulate(MPI_FLOAT, MPI_SUM)
 *   flush: MPI_Win_lock_all + MPI_Put + MPI_Win_flush (then MPI_Win_unlock_all)
 *   msg  : (thread mode) MPI_Isend(N bytes) + MPI_Recv(1-byte ack)
 * The target also watches the last float of its window with plain loads and
 * reports when the data became visible (seen_s, -1 = not during the window).
 * Elapsed << SECS => passive progress; elapsed ~ SECS => needs target in MPI.
 *
 * Build: mpicc -O2 -pthread bench/win_progress.c -o win_progress
 * Run:   mpirun --bind-to none -np 2 ./win_progress MODE NBYTES [excl|shared] [SECS]
 *            [alloc|create] [multiple|serialized]
 *   alloc  = MPI_Win_allocate (osc/sm and osc/rdma may use shared memory directly)
 *   create = MPI_Win_create on malloc'd memory (osc/sm cannot serve it)
 *   last arg = thread level requested (osc/pt2pt refuses THREAD_MULTIPLE)
 * Output: one JSON line per measurement, printed by the origin.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static volatile float *watch; /* last float of the target's window */
static double secs = 2.0;
static int nbytes;

/* Target side of one round: stay in the requested state for `secs`,
 * return when the watched float first became non-zero (-1: never). */
static double target_wait(const char *mode, double t0) {
  double seen = -1, sink = 0;
  while (now() - t0 < secs) {
    if (!strcmp(mode, "inmpi")) {
      int flag;
      MPI_Iprobe(MPI_ANY_SOURCE, 12345, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    } else if (!strcmp(mode, "sleep")) {
      struct timespec d = {0, 1000000}; /* 1 ms */
      nanosleep(&d, NULL);
    } else { /* busy / thread: pure computation */
      for (int i = 0; i < 1000; i++) sink = sink * 1.0000001 + i;
    }
    if (seen < 0 && watch && *watch != 0.0f) seen = now() - t0;
  }
  if (sink == 42) printf("!"); /* keep the spin from being optimised away */
  return seen;
}

/* thread mode: the polling thread on rank 0 */
static volatile int stop_poller;
static void *poller(void *arg) {
  char *buf = arg, ack = 1;
  while (!stop_poller) {
    int flag;
    MPI_Status st;
    MPI_Iprobe(1, 7, MPI_COMM_WORLD, &flag, &st);
    if (flag) {
      MPI_Recv(buf, nbytes, MPI_BYTE, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(&ack, 1, MPI_BYTE, 1, 8, MPI_COMM_WORLD);
    } else {
      struct timespec d = {0, 50000}; /* ~50 us */
      nanosleep(&d, NULL);
    }
  }
  return NULL;
}

int main(int argc, char **argv) {
  int provided, rank;
  int req = (argc > 6 && !strcmp(argv[6], "serialized")) ? MPI_THREAD_SERIALIZED : MPI_THREAD_MULTIPLE;
  MPI_Init_thread(&argc, &argv, req, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char *mode = argc > 1 ? argv[1] : "busy";
  nbytes = argc > 2 ? atoi(argv[2]) : 4096;
  int lock = (argc > 3 && !strcmp(argv[3], "shared")) ? MPI_LOCK_SHARED : MPI_LOCK_EXCLUSIVE;
  if (argc > 4) secs = atof(argv[4]);
  int create = argc > 5 && !strcmp(argv[5], "create");
  int nf = nbytes / 4;
  float *src = malloc(nbytes);
  for (int i = 0; i < nf; i++) src[i] = 1.0f;
  const char *tm[] = {"single", "funneled", "serialized", "multiple"};

  if (!strcmp(mode, "thread")) {
    char *buf = malloc(nbytes);
    pthread_t th;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int r = 0; r < 3; r++) { /* 3 rounds, 5 messages each */
      if (rank == 0 && r == 0) pthread_create(&th, NULL, poller, buf);
      MPI_Barrier(MPI_COMM_WORLD); /* poller may be probing concurrently: THREAD_MULTIPLE */
      double t0 = now();
      if (rank == 0) {
        target_wait("busy", t0);
      } else {
        while (now() - t0 < 0.1) {}
        for (int k = 0; k < 5; k++) {
          MPI_Request rq;
          char ack;
          double t1 = now();
          MPI_Isend(src, nbytes, MPI_BYTE, 0, 7, MPI_COMM_WORLD, &rq);
          MPI_Recv(&ack, 1, MPI_BYTE, 0, 8, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
          MPI_Wait(&rq, MPI_STATUS_IGNORE);
          printf("{\"mode\":\"thread\",\"op\":\"msg\",\"bytes\":%d,\"thread\":\"%s\",\"round\":%d,"
                 "\"k\":%d,\"elapsed_s\":%.6f}\n", nbytes, tm[provided], r, k, now() - t1);
        }
        fflush(stdout);
      }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) { stop_poller = 1; pthread_join(th, NULL); }
    MPI_Finalize();
    return 0;
  }

  float *base;
  MPI_Win win;
  if (create) {
    base = calloc(nf, 4);
    MPI_Win_create(base, nbytes, 4, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
  } else {
    MPI_Win_allocate(nbytes, 4, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
  }
  if (rank == 0) watch = &base[nf - 1];
  /* warm-up (both ranks inside MPI): establishes connections / lazy setup */
  if (rank == 1) {
    MPI_Win_lock(lock, 0, 0, win);
    MPI_Put(src, nf, MPI_FLOAT, 0, 0, nf, MPI_FLOAT, win);
    MPI_Win_unlock(0, win);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  const char *ops[] = {"put", "acc", "flush"};
  for (int o = 0; o < 3; o++) {
    if (rank == 0) { /* zero the window (local access under a self lock) */
      MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
      memset(base, 0, nbytes);
      MPI_Win_unlock(0, win);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = now();
    if (rank == 0) {
      double seen = target_wait(mode, t0);
      MPI_Barrier(MPI_COMM_WORLD);
      MPI_Send(&seen, 1, MPI_DOUBLE, 1, 99, MPI_COMM_WORLD);
    } else {
      while (now() - t0 < 0.1) {}
      double t1 = now(), tl, tp, td, tu = 0;
      if (o < 2) MPI_Win_lock(lock, 0, 0, win); else MPI_Win_lock_all(0, win);
      tl = now();
      if (o == 1) MPI_Accumulate(src, nf, MPI_FLOAT, 0, 0, nf, MPI_FLOAT, MPI_SUM, win);
      else MPI_Put(src, nf, MPI_FLOAT, 0, 0, nf, MPI_FLOAT, win);
      tp = now();
      if (o < 2) MPI_Win_unlock(0, win); else MPI_Win_flush(0, win);
      td = now();
      if (o == 2) { MPI_Win_unlock_all(win); tu = now() - t1; }
      double seen;
      MPI_Barrier(MPI_COMM_WORLD);
      MPI_Recv(&seen, 1, MPI_DOUBLE, 0, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      printf("{\"mode\":\"%s\",\"op\":\"%s\",\"bytes\":%d,\"lock\":\"%s\",\"thread\":\"%s\",\"win\":\"%s\","
             "\"lock_s\":%.6f,\"issue_s\":%.6f,\"elapsed_s\":%.6f,\"unlock_all_s\":%.6f,"
             "\"target_seen_s\":%.6f}\n", mode, ops[o], nbytes,
             o == 2 ? "all" : (lock == MPI_LOCK_SHARED ? "shared" : "excl"), tm[provided],
             create ? "create" : "alloc", tl - t1, tp - t1, td - t1, tu, seen < 0 ? -1 : seen - 0.1);
      fflush(stdout);
    }
  }
  MPI_Win_free(&win);
  MPI_Finalize();
  return 0;
}
