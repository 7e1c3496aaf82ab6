# Compiles every shader variant to SPIR-V at build time, validates it with spirv-val for each
# target environment, and embeds the words in generated/shaders.cpp (no shader compiler at run time).
#
# A variant is one source file plus macros: the storage type (FP16), the packing (PACK) and the
# reduction flavour (SUBGROUP). Layer-wide switches (op, affine, workgroup size) are specialization
# constants, so they need no variant here.
set(VKNORM_SHADER_DIR ${CMAKE_CURRENT_LIST_DIR}/../shaders)

function(vknorm_compile_shaders target outdir)
  file(MAKE_DIRECTORY ${outdir}/spv)
  file(GLOB includes ${VKNORM_SHADER_DIR}/*.glsl)
  set(names "")
  set(spvs "")
  foreach(shader norm_reduce norm_finalize norm_apply norm_fused)
    foreach(fp16 0 1)
      foreach(pack 1 4)
        foreach(sg 0 1)
          if(NOT shader STREQUAL "norm_fused" AND sg EQUAL 1)
            continue()  # only the fused kernel has a subgroup flavour
          endif()
          set(name "${shader}_fp${fp16}_p${pack}_sg${sg}")
          set(spv ${outdir}/spv/${name}.spv)
          # Subgroups and 16-bit storage (StorageBuffer class) need Vulkan 1.1; the rest runs on 1.0.
          if(sg EQUAL 1 OR fp16 EQUAL 1)
            set(env vulkan1.1)
            set(val_envs vulkan1.1 vulkan1.2)
          else()
            set(env vulkan1.0)
            set(val_envs vulkan1.0 vulkan1.1 vulkan1.2)
          endif()
          set(val_cmds "")
          foreach(e ${val_envs})
            list(APPEND val_cmds COMMAND ${SPIRV_VAL} --target-env ${e} ${spv})
          endforeach()
          add_custom_command(OUTPUT ${spv}
            COMMAND ${GLSLANG_VALIDATOR} -V --quiet --target-env ${env} -DFP16=${fp16} -DPACK=${pack} -DSUBGROUP=${sg}
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
  add_custom_command(OUTPUT ${outdir}/shaders.cpp
    COMMAND ${CMAKE_COMMAND} -DOUT=${outdir}/shaders.cpp -DSPV_DIR=${outdir}/spv "-DNAMES=${names}"
            -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_spirv.cmake
    DEPENDS ${spvs} ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/embed_spirv.cmake
    COMMENT "Embedding SPIR-V" VERBATIM)
  add_custom_target(${target} DEPENDS ${outdir}/shaders.cpp)
endfunction()
