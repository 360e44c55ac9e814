// The one default of every communication timeout: each collective, a transport's set-up, the
// rendezvous (GlooOptions, ShmOptions, NcclOptions, StoreOptions, TransportSpec, FaultSpec's
// stall limit; aiacc_train's --comm-timeout takes it as its default). A minute: long enough for
// a slow first step on one rank, short enough that a lost job ends while someone still watches.
#pragma once

#include <chrono>

namespace aiacc::comm {

inline constexpr std::chrono::milliseconds kDefaultTimeout{60000};

}  // namespace aiacc::comm
