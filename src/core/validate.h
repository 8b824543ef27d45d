// Argument validation for every public entry point. Each check names the
// argument and what was expected; nothing is computed before all pass.
#pragma once

#include "core/problem.h"

namespace flashqla {

// Validates forward params and resolves them into a Problem (backend
// included). `entry` prefixes every message ("flashqla_gdn_fwd").
Problem validate_forward(const flashqla_gdn_fwd_params_t* params, const char* entry);

// Validates backward params (the forward part included; fwd.o and
// fwd.final_state are not read by the backward and not checked).
Problem validate_backward(const flashqla_gdn_bwd_params_t* params, const char* entry);

}  // namespace flashqla
