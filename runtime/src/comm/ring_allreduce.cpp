// Our host allreduce ("ring"), in place, over MPI point-to-point with the two neighbours.
//
// The buffer of n elements is cut into p chunks (chunk c: n/p elements, the first n%p
// chunks one more; some are empty when n < p). On rank r, with right = r+1 and
// left = r-1 (mod p):
//
//   reduce-scatter, p-1 steps:  step k: send chunk (r-k) to the right, receive chunk
//                               (r-k-1) from the left and add it into our copy. After the
//                               last step, chunk (r+1) holds the sum over all ranks (and is
//                               divided by p here for an average, so no extra pass).
//   allgather, p-1 steps:       step k: send chunk (r+1-k) to the right, receive the
//                               finished chunk (r-k) from the left straight into the buffer.
//
// Written as one sequence of 2(p-1) receive steps j = 0 .. 2p-3: step j receives chunk
// c = (r-j-1) and, except in the last step, forwards it to the right as soon as it is
// reduced (or received). Each chunk moves in segments of TNT_RING_SEGMENT bytes (two a
// chunk on 2 ranks, see the constructor), so a segment is sent while the next one is still
// being reduced, and a neighbour starts on the next step before this one has finished. Up to kWindow receives are posted ahead; the
// reduce-scatter ones land in kWindow scratch segments, the allgather ones in place.
// Every element's final value is computed by exactly one rank, so all ranks end with
// bitwise-equal results.
//
// Messages from one neighbour are matched in posting order (MPI's non-overtaking rule), so
// one tag per collective suffices; the tag is the collective's number, so a rank that is
// a collective behind never takes another collective's data.
//
// Below CommImpl::small_bytes the ring's 2(p-1) message latencies dominate, and the same
// entry point runs recursive doubling instead: log2(p) full-buffer exchanges with partners
// r ^ 2^i, with the usual fold of the extra ranks when p is not a power of two. Each
// rank adds the same two operands (in the opposite order, which IEEE addition does not
// mind), so results are again equal on all ranks.
#include "comm/ring_allreduce.hpp"

#include "comm/host_reduce.hpp"
#include "tarantella/check.hpp"

#include <algorithm>
#include <vector>

namespace tnt::comm {

namespace {

using detail::CommImpl;
using detail::Waiter;

constexpr int kWindow = 4;  // receives posted ahead of the one being consumed

struct Chunking {
  int64_t n, p;
  int64_t offset(int64_t c) const { return c * (n / p) + std::min(c, n % p); }
  int64_t length(int64_t c) const { return n / p + (c < n % p ? 1 : 0); }
};

// Position in the sequence of (receive step j, segment s of chunk c(j)); empty chunks
// contribute no segments.
struct Cursor {
  int64_t j = 0;  // receive step, 0 .. steps-1
  int64_t s = 0;  // segment within the chunk
};

class Ring {
 public:
  Ring(Waiter& w, char* data, int64_t count, DType dtype, bool average)
      : w_(w),
        c_(w.comm()),
        data_(data),
        dtype_(dtype),
        elem_(static_cast<int64_t>(dtype_size(dtype))),
        average_(average),
        p_(c_.size),
        r_(c_.rank),
        right_((c_.rank + 1) % c_.size),
        left_((c_.rank + c_.size - 1) % c_.size),
        chunks_{count, c_.size},
        steps_(2 * (c_.size - 1)),
        tag_(c_.tag(c_.seq)) {
    seg_elems_ = std::max<int64_t>(1, static_cast<int64_t>(c_.ring_segment_bytes) / elem_);
    // A chunk smaller than a few segments would give no pipelining; cut it finer, but not
    // below min_segment_bytes, where the cost per message starts to dominate.
    int64_t chunk_elems = chunks_.length(0);
    int64_t min_elems = std::max<int64_t>(1, c_.min_segment_bytes / elem_);
    if (p_ == 2 && chunk_elems >= 4 * seg_elems_) {
      // Both neighbours are one peer, and the messages of both directions share the one
      // connection between them: each segment's rendezvous handshake queues behind the
      // peer's own data. On the test bed at 1 Gbit/s (125 MB/s), 256 KB segments moved
      // 78 MB/s of ring bytes for 16-64 MB buffers, two segments a chunk 109-116 MB/s (three
      // ranks: 117 MB/s either way); over shared memory it made no difference. So two. (A
      // 1 MB buffer's four 128 KB segments (below) did better than two: 125 MB/s against 97.)
      seg_elems_ = (chunk_elems + 1) / 2;
    } else if (chunk_elems < 4 * seg_elems_) {
      seg_elems_ = std::min(seg_elems_, std::max(min_elems, (chunk_elems + 3) / 4));
    }
    seg_base_.resize(static_cast<size_t>(p_) + 1, 0);
    for (int64_t c = 0; c < p_; ++c) seg_base_[static_cast<size_t>(c + 1)] = seg_base_[static_cast<size_t>(c)] + segments(c);
    sends_.assign(static_cast<size_t>(seg_base_.back()), MPI_REQUEST_NULL);
    // Receive slots: the reduce-scatter's receives come first (ordinals 0, 1, ...), so no
    // more slots than those receives are ever used.
    int64_t rs_receives = 0;
    for (int64_t j = 0; j < p_ - 1; ++j) rs_receives += segments(chunk_of(j));
    const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(kWindow, rs_receives));
    scratch_ = static_cast<char*>(c_.scratch.get(static_cast<size_t>(slots * seg_elems_ * elem_)));
  }

  ~Ring() {
    if (failed_) {
      detail::abandon_requests(c_, sends_, true);
      detail::abandon_requests(c_, recvs_, true);
    }
  }

  void run() {
    failed_ = true;  // until the end is reached
    // The first send of the reduce-scatter: our own chunk r, unreduced.
    for (int64_t s = 0; s < segments(r_); ++s) send_segment(r_, s);

    Cursor post{0, 0};
    Cursor take{0, 0};
    skip_empty(post);
    skip_empty(take);
    int64_t posted = 0, taken = 0;
    auto fill = [&] {
      while (post.j < steps_ && posted - taken < kWindow && postable(post, take)) {
        post_receive(post, posted);
        ++posted;
        advance(post);
      }
    };
    fill();
    while (take.j < steps_) {
      int64_t c = chunk_of(take.j);
      w_.wait(recvs_[static_cast<size_t>(taken % kWindow)], left_, "(left neighbour, ring)");
      if (take.j < p_ - 1) {
        // Reduce-scatter: add the left neighbour's partial sum into ours.
        char* dst = segment_ptr(c, take.s);
        const char* src = slot_ptr(taken);
        int64_t len = segment_length(c, take.s);
        if (take.j == p_ - 2 && average_) {
          host_sum_div(dst, src, len, dtype_, static_cast<double>(p_));
        } else {
          host_sum(dst, src, len, dtype_);
        }
      }
      if (take.j < steps_ - 1) send_segment(c, take.s);
      ++taken;
      advance(take);
      fill();  // the slot just consumed is free again
    }
    w_.wait_all(sends_, right_, "(right neighbour, ring)");
    failed_ = false;
  }

 private:
  int64_t chunk_of(int64_t j) const { return ((r_ - j - 1) % p_ + p_) % p_; }
  int64_t segments(int64_t c) const { return (chunks_.length(c) + seg_elems_ - 1) / seg_elems_; }
  int64_t segment_length(int64_t c, int64_t s) const {
    return std::min(seg_elems_, chunks_.length(c) - s * seg_elems_);
  }
  char* segment_ptr(int64_t c, int64_t s) const { return data_ + (chunks_.offset(c) + s * seg_elems_) * elem_; }
  char* slot_ptr(int64_t ordinal) const { return scratch_ + (ordinal % kWindow) * seg_elems_ * elem_; }
  MPI_Request& send_request(int64_t c, int64_t s) { return sends_[static_cast<size_t>(seg_base_[static_cast<size_t>(c)] + s)]; }

  void skip_empty(Cursor& k) const {
    while (k.j < steps_ && k.s >= segments(chunk_of(k.j))) {
      ++k.j;
      k.s = 0;
    }
  }
  void advance(Cursor& k) const {
    ++k.s;
    skip_empty(k);
  }

  // An allgather receive writes into the buffer, so it may be posted only once our last
  // send from the same segment has been issued: chunk r's at the start, any other
  // chunk's right after its reduce-scatter step, which is p steps earlier.
  bool postable(const Cursor& k, const Cursor& take) const {
    if (k.j < p_) return true;
    int64_t j0 = k.j - p_;
    return take.j > j0 || (take.j == j0 && take.s > k.s);
  }

  void send_segment(int64_t c, int64_t s) {
    MPI_Request& req = send_request(c, s);
    w_.wait(req, right_, "(right neighbour, ring)");  // normally long complete
    w_.check(MPI_Isend(segment_ptr(c, s), static_cast<int>(segment_length(c, s) * elem_), MPI_BYTE, right_, tag_,
                       c_.comm, &req),
             "MPI_Isend");
  }

  void post_receive(const Cursor& k, int64_t ordinal) {
    int64_t c = chunk_of(k.j);
    int64_t len = segment_length(c, k.s);
    char* into;
    if (k.j < p_ - 1) {
      into = slot_ptr(ordinal);
    } else {
      // Allgather: straight into the buffer. Our earlier send from this segment has been
      // delivered already (the finished chunk contains our contribution), but MPI wants
      // its request completed before the memory is written.
      MPI_Request& prev = send_request(c, k.s);
      w_.wait(prev, right_, "(right neighbour, ring)");
      into = segment_ptr(c, k.s);
    }
    w_.check(MPI_Irecv(into, static_cast<int>(len * elem_), MPI_BYTE, left_, tag_, c_.comm,
                       &recvs_[static_cast<size_t>(ordinal % kWindow)]),
             "MPI_Irecv");
  }

  Waiter& w_;
  CommImpl& c_;
  char* data_;
  DType dtype_;
  int64_t elem_;
  bool average_;
  int64_t p_, r_;
  int right_, left_;
  Chunking chunks_;
  int64_t steps_;
  int tag_;
  int64_t seg_elems_ = 1;
  std::vector<int64_t> seg_base_;      // (p+1,) first segment index of each chunk
  std::vector<MPI_Request> sends_;     // (segments of the whole buffer,) last send from each
  MPI_Request recvs_[kWindow] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  char* scratch_ = nullptr;            // (kWindow, seg_elems) receive slots
  bool failed_ = false;
};

// Recursive doubling for small buffers; see the file comment.
void recursive_doubling(Waiter& w, char* data, int64_t count, DType dtype, bool average) {
  CommImpl& c = w.comm();
  const int p = c.size, r = c.rank, tag = c.tag(c.seq);
  const int bytes = static_cast<int>(count * static_cast<int64_t>(dtype_size(dtype)));
  char* tmp = static_cast<char*>(c.scratch.get(static_cast<size_t>(bytes)));  // (count,)
  MPI_Request reqs[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  struct Guard {
    CommImpl& c;
    MPI_Request* reqs;
    bool armed = true;
    ~Guard() {
      if (armed) detail::abandon_requests(c, std::span<MPI_Request>(reqs, 2), true);
    }
  } guard{c, reqs};

  auto exchange = [&](int peer) {
    w.check(MPI_Irecv(tmp, bytes, MPI_BYTE, peer, tag, c.comm, &reqs[0]), "MPI_Irecv");
    w.check(MPI_Isend(data, bytes, MPI_BYTE, peer, tag, c.comm, &reqs[1]), "MPI_Isend");
    w.wait_all(reqs, peer, "(recursive-doubling partner)");
    host_sum(data, tmp, count, dtype);
  };

  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  const int extra = p - pof2;  // ranks 0 .. 2*extra-1 pair up first
  int vrank;                   // rank among the pof2 that take part in the doubling
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      w.check(MPI_Isend(data, bytes, MPI_BYTE, r + 1, tag, c.comm, &reqs[1]), "MPI_Isend");
      w.wait(reqs[1], r + 1, "(recursive-doubling partner)");
      vrank = -1;
    } else {
      w.check(MPI_Irecv(tmp, bytes, MPI_BYTE, r - 1, tag, c.comm, &reqs[0]), "MPI_Irecv");
      w.wait(reqs[0], r - 1, "(recursive-doubling partner)");
      host_sum(data, tmp, count, dtype);
      vrank = r / 2;
    }
  } else {
    vrank = r - extra;
  }
  if (vrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      int vpeer = vrank ^ mask;
      exchange(vpeer < extra ? vpeer * 2 + 1 : vpeer + extra);
    }
  }
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      w.check(MPI_Irecv(data, bytes, MPI_BYTE, r + 1, tag, c.comm, &reqs[0]), "MPI_Irecv");
      w.wait(reqs[0], r + 1, "(recursive-doubling partner)");
    } else {
      w.check(MPI_Isend(data, bytes, MPI_BYTE, r - 1, tag, c.comm, &reqs[1]), "MPI_Isend");
      w.wait(reqs[1], r - 1, "(recursive-doubling partner)");
    }
  }
  guard.armed = false;
  if (average) host_div(data, count, dtype, static_cast<double>(p));
}

}  // namespace

bool ring_uses_recursive_doubling(const detail::CommImpl& comm, int64_t count, DType dtype) {
  return comm.size > 1 && count > 0 && count * static_cast<int64_t>(dtype_size(dtype)) < comm.small_bytes;
}

void ring_allreduce(Waiter& w, void* data, int64_t count, DType dtype, bool average) {
  CommImpl& c = w.comm();
  TNT_CHECK(host_reducible(dtype), "{}: the ring reduces f32, f64, i32 and i64, not {}", w.op(), dtype_name(dtype));
  TNT_CHECK(!average || is_floating(dtype), "{}: an average needs a floating-point dtype, got {}", w.op(),
            dtype_name(dtype));
  if (count == 0 || c.size == 1) return;  // the sum over one rank is the buffer itself
  if (ring_uses_recursive_doubling(c, count, dtype)) {
    recursive_doubling(w, static_cast<char*>(data), count, dtype, average);
    return;
  }
  Ring ring(w, static_cast<char*>(data), count, dtype, average);
  ring.run();
}

}  // namespace tnt::comm
