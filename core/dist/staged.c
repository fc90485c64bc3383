/*
** staged.c -- GPU replicas over a host communicator (ember.h, em_comm_staged):
** the local group or MPI moves the bytes, and commdev.c stages each device
** buffer through pinned host memory around the collective, on the device's
** communication stream -- the path emulated devices take inside em_comm_nccl,
** here on real GPUs as well.
**
** Why a communicator of its own. NCCL refuses two ranks on one device, so two
** replicas that share a GPU (`ember --replicas 2 --devices cuda:0,cuda:0`)
** cannot use it; a host communicator can, and with c->dev set its collectives
** keep the device order NCCL would (the compute stream's mark before the copy
** in, the caller's join after the copy back), so the reducer's buckets still
** overlap backward on real streams.
*/
#include "comm.h"

em_status em_comm_staged(em_state *S, int device, em_local_group *g, int rank,
                         double timeout_s, em_comm **out) {
  if (!out) return emi_error(S, EM_ERR_ARG, "comm_staged: NULL output");
  *out = NULL;
  emi_commdev *dev;
  em_status st = emi_commdev_open(S, device, &dev);
  if (st) return st;
  em_comm *c;
  st = g ? em_comm_local(S, g, rank, timeout_s, &c) : em_comm_mpi(S, timeout_s, &c);
  if (st) {
    emi_commdev_close(dev);
    return st;
  }
  /* the host backend is not device-native: comm.c stages around its run and
  ** sends through it with host copies; em_comm_free closes dev */
  c->dev = dev;
  *out = c;
  return EM_OK;
}

int em_comm_device_native(const em_comm *c) {
  return c && c->dev && c->be->device_native;
}
