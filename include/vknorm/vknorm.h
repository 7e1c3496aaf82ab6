#pragma once
#include "vknorm/context.h"
#include "vknorm/mat.h"
#include "vknorm/norm.h"
#include "vknorm/option.h"
