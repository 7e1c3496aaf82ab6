# Compiles every shader variant to SPIR-V at build time, validates it with spirv-val for each
# target environment, and embeds the words in generated/shaders.cpp (no shader compiler at run time).
#
# A variant is one source file plus macros: the storage type (FP16), the packing (PACK 1 or 4, or
# v4: pack1 read as vec4s), the reduction flavour (SUBGROUP) and, for the kernels that write the
# output, whether they write it in place or apart from a read-only input (OUT_OF_PLACE, "_oop").
# Layer-wide switches (op, affine, workgroup size, items) are specialization constants, so they need
# no variant here.
set(VKNORM_SHADER_DIR ${CMAKE_CURRENT_LIST_DIR}/../shaders)

function(vknorm_compile_shaders target outdir)
  file(MAKE_DIRECTORY ${outdir}/spv)
  file(GLOB includes ${VKNORM_SHADER_DIR}/*.glsl)
  set(names "")
  set(spvs "")
  foreach(shader norm_reduce norm_finalize norm_apply norm_fused norm_cooperative norm_clear copy)
    foreach(fp16 0 1)
      foreach(pack 1 4 v4)
        foreach(sg 0 1)
         foreach(oop 0 1)
          if(oop EQUAL 1 AND NOT (shader STREQUAL "norm_fused" OR shader STREQUAL "norm_cooperative" OR
                                  shader STREQUAL "norm_apply"))
            continue()  # the kernels that write the output
          endif()
          if(NOT (shader STREQUAL "norm_fused" OR shader STREQUAL "norm_cooperative") AND sg EQUAL 1)
            continue()  # the kernels that hold groups in registers have a subgroup flavour
          endif()
          if(pack STREQUAL "v4" AND NOT shader STREQUAL "norm_fused")
            continue()  # vec4 loads of pack1 blobs: the fused kernel only
          endif()
          if(pack STREQUAL "v4")
            set(pack_defs -DPACK=1 -DVEC4=1)
          else()
            set(pack_defs -DPACK=${pack} -DVEC4=0)
          endif()
          if((shader STREQUAL "copy" OR shader STREQUAL "norm_clear") AND NOT (fp16 EQUAL 0 AND pack STREQUAL "1"))
            continue()  # the benchmark roof, the counters' clear: one variant each
          endif()
          set(oop_tag "")
          if(oop EQUAL 1)
            set(oop_tag "_oop")
          endif()
          set(name "${shader}${oop_tag}_fp${fp16}_p${pack}_sg${sg}")
          set(spv ${outdir}/spv/${name}.spv)
          # Subgroups and 16-bit storage (StorageBuffer class) need Vulkan 1.1; the rest runs on 1.0.
          if(sg EQUAL 1 OR fp16 EQUAL 1)
            set(env vulkan1.1)
            set(val_envs vulkan1.1 vulkan1.2)
          else()
            set(env vulkan1.0)
            set(val_envs vulkan1.1 vulkan1.2)
            if(VKNORM_VULKAN_1_0_TARGET)
              list(PREPEND val_envs vulkan1.0)  # the variants a Vulkan 1.0 device runs
            endif()
          endif()
          set(val_cmds "")
          foreach(e ${val_envs})
            list(APPEND val_cmds COMMAND ${SPIRV_VAL} --target-env ${e} ${spv})
          endforeach()
          add_custom_command(OUTPUT ${spv}
            COMMAND ${GLSLANG_VALIDATOR} -V --quiet --target-env ${env} -DFP16=${fp16} ${pack_defs} -DSUBGROUP=${sg}
                    -DOUT_OF_PLACE=${oop}
                    -I${VKNORM_SHADER_DIR} -o ${spv} ${VKNORM_SHADER_DIR}/${shader}.comp
            ${val_cmds}
            DEPENDS ${VKNORM_SHADER_DIR}/${shader}.comp ${includes}
            COMMENT "SPIR-V ${name}" VERBATIM)
          list(APPEND names ${name})
          list(APPEND spvs ${spv})
         endforeach()
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  add_custom_command(OUTPUT ${outdir}/shaders.cpp
    COMMAND ${CMAKE_COMMAND} -DOUT=${outdir}/shaders.cpp -DSPV_DIR=${outdir}/spv "-DNAMES=${names}"
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_spirv.cmake
    DEPENDS ${spvs} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_spirv.cmake
    COMMENT "Embedding SPIR-V" VERBATIM)
  add_custom_target(${target} DEPENDS ${outdir}/shaders.cpp)
endfunction()
